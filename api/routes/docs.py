"""The API's browser docs: ``GET /docs`` (Swagger UI) and ``GET /redoc`` (ReDoc), whose scripts,
styles and icon the gateway serves itself (the copies the fastapi-offline package ships) instead of
loading them from a CDN: the pages work offline and behind a firewall.

Off with API keys (the pages cannot send one): api/app.py leaves this router out then.
"""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import APIRouter, HTTPException, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse

router = APIRouter()
ASSETS_DIR = Path(fastapi_offline.__file__).resolve().parent / "static"
ASSETS_PATH = "/docs/assets"
#: The files served under ASSETS_PATH, with their media types; nothing else there is.
ASSETS = {"swagger-ui-bundle.js": "text/javascript", "swagger-ui.css": "text/css",
          "redoc.standalone.js": "text/javascript", "favicon.png": "image/png"}
#: Swagger UI sends the schema to an online validator for its badge unless told not to.
SWAGGER_UI_PARAMETERS = {"validatorUrl": None}
#: Nothing from another origin: ReDoc's footer shows a logo from its CDN, which a browser then
#: leaves out (ReDoc drops an image that fails). The inline script starts Swagger UI; ReDoc's
#: search runs in a worker made from a blob.
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' "
                               "'unsafe-inline'; img-src 'self' data:; worker-src 'self' blob:; object-src 'none'; "
                               "base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
}


def _prefix(request: Request) -> str:
    """The path prefix the gateway is served under (behind a proxy), if any."""
    return str(request.scope.get("root_path", "")).rstrip("/")


@router.get("/docs", include_in_schema=False)
async def swagger_ui(request: Request) -> HTMLResponse:
    root, app = _prefix(request), request.app
    page = get_swagger_ui_html(
        openapi_url=f"{root}{app.openapi_url}", title=f"{app.title} - Swagger UI",
        swagger_js_url=f"{root}{ASSETS_PATH}/swagger-ui-bundle.js",
        swagger_css_url=f"{root}{ASSETS_PATH}/swagger-ui.css",
        swagger_favicon_url=f"{root}{ASSETS_PATH}/favicon.png",
        swagger_ui_parameters={**(app.swagger_ui_parameters or {}), **SWAGGER_UI_PARAMETERS})
    page.headers.update(HEADERS)
    return page


@router.get("/redoc", include_in_schema=False)
async def redoc(request: Request) -> HTMLResponse:
    root, app = _prefix(request), request.app
    page = get_redoc_html(
        openapi_url=f"{root}{app.openapi_url}", title=f"{app.title} - ReDoc",
        redoc_js_url=f"{root}{ASSETS_PATH}/redoc.standalone.js",
        redoc_favicon_url=f"{root}{ASSETS_PATH}/favicon.png", with_google_fonts=False)
    page.headers.update(HEADERS)
    return page


@router.get(ASSETS_PATH + "/{name}", include_in_schema=False)
async def asset(name: str) -> FileResponse:
    if name not in ASSETS:
        raise HTTPException(404)
    return FileResponse(ASSETS_DIR / name, media_type=ASSETS[name], headers={"Cache-Control": "max-age=86400"})
