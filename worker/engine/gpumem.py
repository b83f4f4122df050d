"""The free memory of this process's GPU, read through NVML (vLLM's own copy of pynvml): no CUDA
context in the process that asks (a worker's frontend has none; creating one costs GPU memory).

Used by a multi-model worker's model to tell whether its weights fit beside the model still awake
(worker/engine/host.py, ``wake_weights``)."""

from __future__ import annotations

import logging
import os
from typing import Any

log = logging.getLogger(__name__)


def _handle(nvml: Any) -> Any:
    """The first visible GPU: CUDA_VISIBLE_DEVICES' first entry (an index or a UUID), else GPU 0."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
    if first.isdigit():
        return nvml.nvmlDeviceGetHandleByIndex(int(first))
    return nvml.nvmlDeviceGetHandleByUUID(first)


def free_bytes() -> int | None:
    """Free memory of the first visible GPU in bytes; None where NVML cannot tell (no GPU, no driver)."""
    try:
        from vllm.third_party import pynvml as nvml

        nvml.nvmlInit()
        try:
            return int(nvml.nvmlDeviceGetMemoryInfo(_handle(nvml)).free)
        finally:
            nvml.nvmlShutdown()
    except Exception as e:  # no GPU here, or no NVML: nothing to overlap
        log.debug("NVML: no free memory reading: %s", e)
        return None
