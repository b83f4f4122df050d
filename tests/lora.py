"""Random LoRA adapters for the tests and the benchmarks (the built-in model's, or any Llama-shaped
model's): nothing in production builds adapters."""

from __future__ import annotations

import json
from pathlib import Path


def build_tiny_adapter(out: Path, base: Path, seed: int, rank: int = 8, scale: float = 0.5) -> Path:
    """Write a LoRA adapter for the model in ``base`` (PEFT layout: adapter_config.json and
    adapter_model.safetensors) with random weights from ``seed`` (standard deviation ``scale``), on
    its attention projections. The default is large enough that each adapter steers the tiny
    model's text its own way (tests, bench); a model of many wide layers wants far smaller."""
    import torch
    from safetensors.torch import save_file

    cfg = json.loads((base / "config.json").read_text())
    hidden, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    head_dim = cfg.get("head_dim") or hidden // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * head_dim
    shapes = {"q_proj": (hidden, cfg["num_attention_heads"] * head_dim), "k_proj": (hidden, kv),
              "v_proj": (hidden, kv), "o_proj": (cfg["num_attention_heads"] * head_dim, hidden)}
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(layers):
        for name, (fan_in, fan_out) in shapes.items():
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{name}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, fan_in, generator=gen) * scale
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(fan_out, rank, generator=gen) * scale
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, out / "adapter_model.safetensors")
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": 2 * rank,
              "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False, "modules_to_save": None,
              "target_modules": sorted(shapes), "base_model_name_or_path": str(base)}
    (out / "adapter_config.json").write_text(json.dumps(config, indent=1))
    return out
