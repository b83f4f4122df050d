from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.unit.workerkit import start_redis


@pytest.fixture(scope="module")
def own_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of a redis-server for this test module alone."""
    yield from start_redis(tmp_path_factory.mktemp("own-redis"))
