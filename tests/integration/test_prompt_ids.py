"""The real vLLM worker's tokenizing next to the gateway's (api/prompt_ids.py): the probe each
worker announces matches the gateway's, from the model's folder and from what the worker published
in Redis for gateways on other hosts (worker/engine/tokenizer_files.py)."""

from __future__ import annotations

from inferq.api.prompt_ids import from_files, gateway_tokenizer
from inferq.shared import keys
from inferq.shared.schemas import WorkerInfo


def test_the_gateway_tokenizes_as_the_real_workers_from_their_folder_and_from_redis(stack) -> None:
    r = stack.redis.client()
    model = "inferq-tiny"
    raws = [r.get(keys.worker(i)) for i in r.zrange(keys.workers(model), 0, -1)]
    infos = [WorkerInfo.model_validate_json(x) for x in raws if x]
    assert infos
    for info in infos:
        assert set(info.prompt_probe) == {"prompt", "chat"} and info.tokenizer_files, info
        published = from_files(info.tokenizer_files, r.hgetall(info.tokenizer_files))
        assert published.probe == info.prompt_probe
        assert gateway_tokenizer(info.tokenizer).probe == info.prompt_probe
