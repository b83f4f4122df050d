"""The chaos suite (``python -m tests.chaos``, ``make chaos``): scenarios in ``scenarios``, the
client and its checks in ``client``."""

from tests.chaos.scenarios import run_chaos

__all__ = ["run_chaos"]
