"""The naive pattern: Hugging Face ``model.generate`` behind a FastAPI endpoint.

``POST /generate {prompt, max_tokens, temperature, ignore_eos}`` answers with the whole text.

- ``--mode serial``: one request at a time (a lock around ``generate``), the way a model is
  usually first put behind an HTTP endpoint.
- ``--mode static``: static batching: collect requests for up to ``--window-ms`` (at most
  ``--batch-size``), left-pad them, ``generate`` them together; everyone waits for the batch,
  and requests arriving meanwhile wait for the next one.

Run: ``python -m bench.naive_server --model PATH --port P [--mode static] [--load-format dummy]``.
With ``--load-format dummy`` the model is built from its config with random weights directly on
the device in bf16 (seconds, even for 7B), matching vLLM's ``load_format=dummy``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

log = logging.getLogger("naive")


class Body(BaseModel):
    prompt: str = Field(min_length=1)
    max_tokens: int = Field(default=16, ge=1)
    temperature: float = Field(default=0.0, ge=0.0)
    ignore_eos: bool = False


def load_model(path: str, load_format: str, dtype_name: str) -> tuple[Any, Any, str]:
    """(model, tokenizer, device): on CUDA when there is a GPU, else CPU."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if dtype_name in ("auto", "bfloat16") else getattr(torch, dtype_name)
    t0 = time.perf_counter()
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # parameters are created in bf16 (no fp32 copy first)
    try:
        if load_format == "dummy":
            with torch.device(device):
                model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
        else:
            model = AutoModelForCausalLM.from_pretrained(path)
    finally:
        torch.set_default_dtype(previous)
    model = model.to(device=device, dtype=dtype).eval()
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token or tok.unk_token
    log.info("model %s (%s) on %s in %s loaded in %.1f s", path, load_format, device, dtype,
             time.perf_counter() - t0)
    return model, tok, device


@dataclass
class Job:
    prompt: str
    max_tokens: int
    temperature: float
    ignore_eos: bool
    future: asyncio.Future[dict[str, Any]]


class Generator:
    def __init__(self, model: Any, tok: Any, device: str) -> None:
        self.model, self.tok, self.device = model, tok, device

    def generate(self, jobs: list[Job]) -> list[dict[str, Any]]:
        """One ``model.generate`` call for the whole batch (blocking: run it in a thread)."""
        import torch

        enc = self.tok([j.prompt for j in jobs], return_tensors="pt", padding=True).to(self.device)
        new = max(j.max_tokens for j in jobs)
        temp = jobs[0].temperature
        kwargs: dict[str, Any] = {"max_new_tokens": new, "pad_token_id": self.tok.pad_token_id,
                                      "do_sample": temp > 0}
        if temp > 0:
            kwargs.update(temperature=temp, top_p=1.0, top_k=0)
        if all(j.ignore_eos for j in jobs):
            kwargs["min_new_tokens"] = new  # EOS is masked until max_new_tokens: fixed output length
        with torch.inference_mode():
            out = self.model.generate(**enc, **kwargs)
        width = enc["input_ids"].shape[1]
        results = []
        for i, j in enumerate(jobs):
            ids = out[i, width:width + j.max_tokens].tolist()
            if self.tok.pad_token_id in ids and not j.ignore_eos:
                ids = ids[:ids.index(self.tok.pad_token_id)]
            results.append({"text": self.tok.decode(ids, skip_special_tokens=True),
                            "prompt_tokens": int(enc["attention_mask"][i].sum()),
                            "completion_tokens": len(ids)})
        return results


async def _batcher(gen: Generator, pending: asyncio.Queue[Job], state: dict[str, Any], batch_size: int,
                   window_s: float) -> None:
    """Static batching: up to ``batch_size`` requests that arrive within ``window_s`` of the first
    go to the model in one call."""
    while True:
        batch = [await pending.get()]
        deadline = time.perf_counter() + window_s
        while len(batch) < batch_size and (left := deadline - time.perf_counter()) > 0:
            try:
                batch.append(await asyncio.wait_for(pending.get(), left))
            except TimeoutError:
                break
        state["batches"] += 1
        state["batched_requests"] += len(batch)
        try:
            results = await asyncio.to_thread(gen.generate, batch)
            for j, res in zip(batch, results, strict=True):
                j.future.set_result(res)
        except Exception as e:
            for j in batch:
                j.future.set_exception(e)


def create_app(gen: Generator, mode: str, batch_size: int, window_s: float) -> Any:
    from fastapi import FastAPI

    lock = asyncio.Lock()
    pending: asyncio.Queue[Job] = asyncio.Queue()
    state: dict[str, Any] = {"batches": 0, "batched_requests": 0}

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        task = (asyncio.get_running_loop().create_task(_batcher(gen, pending, state, batch_size, window_s))
                if mode == "static" else None)
        yield
        if task is not None:
            task.cancel()

    app = FastAPI(title=f"naive-hf ({mode})", lifespan=lifespan)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "mode": mode, "batches": state["batches"],
                "batched_requests": state["batched_requests"]}

    @app.post("/generate")
    async def generate(body: Body) -> dict[str, Any]:
        job = Job(body.prompt, body.max_tokens, body.temperature, body.ignore_eos,
                  asyncio.get_running_loop().create_future())
        if mode == "static":
            await pending.put(job)
            return await job.future
        async with lock:
            return (await asyncio.to_thread(gen.generate, [job]))[0]

    return app


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--mode", choices=["serial", "static"], default="serial")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--window-ms", type=float, default=50.0)
    p.add_argument("--load-format", default="auto")
    p.add_argument("--dtype", default="auto")
    a = p.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    gen = Generator(*load_model(a.model, a.load_format, a.dtype))
    app = create_app(gen, a.mode, a.batch_size, a.window_ms / 1000)
    uvicorn.run(app, host=a.host, port=a.port, log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
