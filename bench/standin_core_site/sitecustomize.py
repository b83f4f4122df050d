"""Loaded at interpreter start where this folder is on PYTHONPATH: with BENCH_STANDIN_CORE set, the
process's AsyncLLMs use bench/standin_core.py's stand-in EngineCore."""

import os

if os.environ.get("BENCH_STANDIN_CORE") is not None:
    from bench.standin_core import install

    install()
