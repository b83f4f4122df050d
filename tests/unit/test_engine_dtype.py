"""The dtype a worker's engine runs in (worker/engine/args.py:engine_dtype): the demo model in float32
on a CPU without native bfloat16, everything else as configured."""

from __future__ import annotations

import pytest
import torch

from inferq.shared.settings import Settings
from inferq.worker.engine.args import engine_dtype


@pytest.fixture
def native_bf16(monkeypatch: pytest.MonkeyPatch):
    def set_to(avx512_bf16: bool, amx: bool) -> None:
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    return set_to


def test_the_demo_model_runs_in_float32_on_a_cpu_without_native_bf16(native_bf16) -> None:
    native_bf16(False, False)
    assert engine_dtype(Settings(), cpu=True) == "float32"


@pytest.mark.parametrize("avx512_bf16, amx", [(True, False), (False, True)])
def test_a_cpu_with_native_bf16_keeps_vllms_choice(native_bf16, avx512_bf16: bool, amx: bool) -> None:
    native_bf16(avx512_bf16, amx)
    assert engine_dtype(Settings(), cpu=True) == "auto"


def test_a_users_model_an_explicit_dtype_and_a_gpu_are_left_alone(native_bf16) -> None:
    native_bf16(False, False)
    assert engine_dtype(Settings(model="/models/mine"), cpu=True) == "auto"
    assert engine_dtype(Settings(dtype="bfloat16"), cpu=True) == "bfloat16"
    assert engine_dtype(Settings(), cpu=False) == "auto"
