"""FastAPI dependencies: the process-wide objects the lifespan creates, typed for routes."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from starlette.requests import HTTPConnection

from api.service import JobService
from api.streams import StreamHub
from shared.settings import Settings


def get_service(conn: HTTPConnection) -> JobService:
    return conn.app.state.service


def get_hub(conn: HTTPConnection) -> StreamHub:
    return conn.app.state.hub


def get_settings_dep(conn: HTTPConnection) -> Settings:
    return conn.app.state.settings


Service = Annotated[JobService, Depends(get_service)]
Hub = Annotated[StreamHub, Depends(get_hub)]
SettingsDep = Annotated[Settings, Depends(get_settings_dep)]
__all__ = ["Service", "Hub", "SettingsDep", "Request"]
