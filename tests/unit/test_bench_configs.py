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


SWAPS = sorted((Path(__file__).resolve().parents[2] / "bench" / "configs" / "swap").glob("*.json"))


@pytest.mark.parametrize("path", SWAPS, ids=lambda p: p.name)
def test_the_swap_config_parses(path: Path) -> None:
    """bench/configs/swap/ holds bench.swap's configs (every field one of SwapConfig's; each model's settings
    ones a model may set for itself); the GPU's: medians of 3, sleep mode on, both models' caches sized."""
    import json

    from bench.swap import SwapConfig
    from inferq.shared.served_models import ModelSpec
    from inferq.shared.settings import Settings

    raw = json.loads(path.read_text())
    cfg = SwapConfig(**{**raw, "models": [{k: v for k, v in m.items() if k != "tiny_seed"} for m in raw["models"]]})
    assert cfg.name == path.stem and len(cfg.models) >= 2
    models = [ModelSpec(**m) for m in cfg.models]
    env = {k.removeprefix("INFERQ_").lower(): v for k, v in cfg.env.items()}
    Settings(**env, models=models)  # type: ignore[arg-type]
    if path.stem.startswith("h200"):
        assert cfg.repeats >= 3 and env["sleep_mode"] == "on" and "kv_cache_gib" in env
