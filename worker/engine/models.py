"""Resolve which model a worker serves; build the built-in tiny demo model on first use.

The demo model is a 2-layer Llama with random weights (fixed seed) and a byte-level BPE tokenizer
trained on this machine's Python standard library, saved in Hugging Face layout (config.json,
model.safetensors, tokenizer.json, tokenizer_config.json with a chat template). It produces
gibberish at real speed: it exists so that the whole pipeline runs offline, on a CPU, in seconds.
"""

from __future__ import annotations

import fcntl
import glob
import json
import logging
import os
import shutil
import sysconfig
import tempfile
from collections.abc import Callable
from pathlib import Path

from inferq.shared.settings import TINY_VERSION, Settings

log = logging.getLogger(__name__)

TINY_VOCAB = 4096
TINY_MAX_LEN = 8192
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)


#: Embedding sizes the built-in embedding model answers for ``dimensions`` (its full size is 256).
TINY_EMBED_DIMENSIONS = [32, 64, 128, 256]


def resolve_model(settings: Settings) -> str:
    """The model path or HF id the engine loads: ``INFERQ_MODEL`` or the (built) tiny model, or
    with ``INFERQ_RUNNER=pooling`` the tiny embedding model."""
    if settings.model:
        return settings.model
    path = tiny_embed_model_dir(settings) if settings.runner == "pooling" else tiny_model_dir(settings)
    log.warning(
        "INFERQ_MODEL is not set: serving the built-in TINY DEMO MODEL (random weights, gibberish "
        "output) from %s. Point INFERQ_MODEL at a Hugging Face id or a local model folder to "
        "serve a real model, e.g. INFERQ_MODEL=mistralai/Mistral-7B-Instruct-v0.2.",
        path,
    )
    return str(path)


def tiny_model_dir(settings: Settings) -> Path:
    """Return the tiny model's folder, building it once (safe against concurrent builders)."""
    return _built_once(settings.builtin_model_dir, build_tiny_model)


def tiny_embed_model_dir(settings: Settings) -> Path:
    """The tiny embedding model's folder: the tiny model's weights and tokenizer (linked), its config
    saying which Matryoshka sizes it answers. Served with INFERQ_RUNNER=pooling (vLLM turns the
    causal model into an embedding model: the last token's hidden state, normalized)."""
    base = tiny_model_dir(settings)

    def build(out: Path) -> None:
        for f in base.iterdir():
            if f.name != "config.json":
                os.symlink(f, out / f.name)
        cfg = json.loads((base / "config.json").read_text())
        (out / "config.json").write_text(json.dumps({**cfg, "matryoshka_dimensions": TINY_EMBED_DIMENSIONS},
                                                    indent=2))

    return _built_once(settings.builtin_embed_model_dir, build)


def tiny_variant_dir(settings: Settings, seed: int) -> Path:
    """Another tiny model: the tiny model's tokenizer (linked) and architecture, its weights drawn
    from ``seed`` (a second model for a multi-model worker's tests and benchmarks: it answers
    differently). Built once (well under a second: no tokenizer to train), in cache_dir."""
    base = tiny_model_dir(settings)

    def build(out: Path) -> None:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        for f in base.iterdir():
            if f.name not in ("config.json", "model.safetensors", "generation_config.json"):
                os.symlink(f, out / f.name)
        torch.manual_seed(seed)
        model = LlamaForCausalLM(LlamaConfig.from_pretrained(base)).to(torch.bfloat16)
        model.save_pretrained(out, safe_serialization=True)

    return _built_once(settings.cache_dir / "models" / f"inferq-tiny-{TINY_VERSION}-seed{seed}", build)


def _built_once(target: Path, build: Callable[[Path], None]) -> Path:
    """``target``, built by ``build`` into a temporary folder moved in place, once (safe against
    concurrent builders)."""
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "config.json").exists():
            tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tiny-"))
            try:
                build(tmp)
                os.replace(tmp, target)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return target


def _training_files(limit: int = 600) -> list[str]:
    stdlib = sysconfig.get_paths()["stdlib"]
    files = sorted(glob.glob(os.path.join(stdlib, "**", "*.py"), recursive=True))
    return files[:limit]


def build_tiny_model(out: Path) -> None:
    """Write the tiny Llama model and its tokenizer into ``out`` (about 5 s on 2 cores)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    log.info("building the tiny demo model in %s", out)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(_training_files(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=TINY_MAX_LEN,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=TINY_VOCAB,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=TINY_MAX_LEN,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    (out / "inferq-tiny.json").write_text(json.dumps({"version": TINY_VERSION, "demo": True}))
