"""Every workload in bench/configs parses: a GPU run is no time to find a typo in one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.config import load_workload

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "bench" / "configs").glob("*.json"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_the_config_parses(path: Path) -> None:
    w = load_workload(path)
    assert w.name == path.stem and w.targets


def test_the_gpu_configs_spread_the_load_client() -> None:
    gpu = [load_workload(p) for p in CONFIGS if p.stem.endswith("clients4") or p.stem.startswith("h200x2")]
    assert gpu and all(w.client_processes == 4 for w in gpu), [(w.name, w.client_processes) for w in gpu]


SESSIONS = sorted((Path(__file__).resolve().parents[2] / "bench" / "configs" / "sessions").glob("*.json"))


@pytest.mark.parametrize("path", SESSIONS, ids=[p.stem for p in SESSIONS])
def test_the_sessions_config_parses(path: Path) -> None:
    """bench/configs/sessions/ holds bench.sessions' configs (every field one of SessionsConfig's)."""
    import json

    from bench.sessions import SessionsConfig, stacks

    cfg = SessionsConfig(**json.loads(path.read_text()))
    assert cfg.name == path.stem and stacks(cfg) and cfg.repeats >= 3


EMBEDDINGS = sorted((Path(__file__).resolve().parents[2] / "bench" / "configs" / "embeddings").glob("*.json"))


@pytest.mark.parametrize("path", EMBEDDINGS, ids=lambda p: p.name)
def test_the_embeddings_config_parses(path: Path) -> None:
    """bench/configs/embeddings/ holds bench.embeddings' configs (every field one of EmbedConfig's)."""
    from bench.embeddings import EmbedConfig

    cfg = EmbedConfig(**json.loads(path.read_text()))
    assert cfg.inputs >= max(cfg.batches) and cfg.repeats >= 3
