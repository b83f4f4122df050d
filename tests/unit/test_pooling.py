"""Embedding jobs without an engine: the OpenAI request's forms of ``input`` as a job's inputs, the
refusals that name their field, the packing of vectors, a model's kind, and the inputs' fit to the
context window."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from pydantic import ValidationError

from inferq.api.openai.embeddings import EmbeddingRequest, Vectors, embedding_response, vectors_of
from inferq.api.openai.scores import RerankRequest, ScoreRequest, rerank_response, score_response
from inferq.shared.errors import Conflict, InvalidRequest
from inferq.shared.pooling import MAX_EMBED_INPUTS, EmbedInputs, check_task, unpack_vector
from inferq.shared.request_limits import check_limits
from inferq.shared.schemas import DoneEvent, JobRequest, Usage
from inferq.shared.settings import Settings
from inferq.worker.jobs.pooling import fitted, pack_vector


@pytest.mark.parametrize(("given", "texts", "ids"), [
    ("hi", ["hi"], None),
    (["a", "b"], ["a", "b"], None),
    ([1, 2, 3], None, [[1, 2, 3]]),
    ([[1, 2], [3]], None, [[1, 2], [3]]),
])
def test_each_form_of_input_is_a_list_of_inputs(given: object, texts: list[str] | None,
                                                ids: list[list[int]] | None) -> None:
    job = EmbeddingRequest(input=given, dimensions=64).inputs()
    assert (job.texts, job.token_ids, job.dimensions) == (texts, ids, 64)


@pytest.mark.parametrize("body", [
    {"input": []}, {"input": [[]]}, {"input": [-1]}, {"input": "x", "encoding_format": "int8"},
    {"input": "x", "dimensions": 0}, {"input": "x", "truncate_prompt_tokens": -2}, {"input": "x", "n": 2},
    {"input": ["x"] * (MAX_EMBED_INPUTS + 1)}, {"input": ["a", 1]},
])
def test_malformed_requests_are_refused(body: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        EmbeddingRequest.model_validate(body)


def test_a_job_has_one_kind_of_input() -> None:
    with pytest.raises(ValidationError, match="exactly one of 'prompt'"):
        JobRequest(prompt="x", embed=EmbedInputs(texts=["x"]))
    with pytest.raises(ValidationError, match="exactly one of 'texts' or 'token_ids'"):
        EmbedInputs(texts=["x"], token_ids=[[1]])
    assert JobRequest(embed=EmbedInputs(texts=["x"])).prompt_param == "input"


def test_an_input_over_the_character_limit_is_named() -> None:
    s = Settings(max_prompt_chars=10)
    with pytest.raises(InvalidRequest, match="input 1 is 11 characters; the limit is 10") as e:
        check_limits(JobRequest(embed=EmbedInputs(texts=["short", "x" * 11])), s)
    assert e.value.param == "input"
    with pytest.raises(InvalidRequest, match="input 0 is 11 token ids"):
        check_limits(JobRequest(embed=EmbedInputs(token_ids=[[1] * 11])), s)


def test_vectors_are_float32_little_endian_in_base64() -> None:
    packed = pack_vector([0.5, -1.25, 3.0])
    import base64

    assert base64.b64decode(packed) == struct.pack("<3f", 0.5, -1.25, 3.0)
    assert unpack_vector(packed) == [0.5, -1.25, 3.0]
    # what the engine hands over: a float array (of any width), packed as float32 all the same
    wide = np.array([0.5, -1.25, 3.0], dtype=">f8")
    assert pack_vector(wide) == packed
    assert unpack_vector(pack_vector(np.arange(4096, dtype=np.float32) / 7)) == (np.arange(4096, dtype=np.float32)
                                                                                 / 7).tolist()


def test_the_answer_in_floats_or_base64() -> None:
    got = vectors_of(DoneEvent(seq=1, embeddings=[pack_vector([0.25, 0.5])], usage=Usage(prompt_tokens=4)))
    assert got is not None
    floats = embedding_response("job-1", "m", EmbeddingRequest(input="x"), got)
    b64 = embedding_response("job-1", "m", EmbeddingRequest(input="x", encoding_format="base64"), got)
    assert floats.data[0].embedding == [0.25, 0.5] and b64.data[0].embedding == got.packed[0]
    assert (floats.usage.prompt_tokens, floats.usage.total_tokens, floats.usage.completion_tokens) == (4, 4, 0)


def test_a_cancelled_job_has_no_vectors() -> None:
    with pytest.raises(Conflict, match="cancelled"):
        vectors_of(DoneEvent(seq=1, status="cancelled"))


def test_a_model_serves_its_own_kind() -> None:
    check_task(["embed", "token_embed"], True, "e")
    check_task(["generate"], False, "g")
    check_task([], True, "unknown")  # not known: the engine decides
    for tasks, embedding in ((["generate"], True), (["embed"], False)):
        with pytest.raises(InvalidRequest) as e:
            check_task(tasks, embedding, "m")
        assert (e.value.param, e.value.code) == ("model", "model_task_unsupported")


def test_inputs_are_cut_then_fit_the_context_window() -> None:
    spec = EmbedInputs(token_ids=[[1] * 10])
    with pytest.raises(InvalidRequest, match="input 1 has 9 tokens, more than the model's context window of 8"):
        fitted([[1] * 3, [1] * 9], spec, 8)
    assert fitted([[1, 2, 3, 4], [5]], EmbedInputs(token_ids=[[1]], truncate_prompt_tokens=2), 8) == [[1, 2], [5]]
    assert fitted([list(range(12))], EmbedInputs(token_ids=[[1]], truncate_prompt_tokens=-1), 8) == [list(range(8))]
    with pytest.raises(InvalidRequest, match="input 0 has no tokens"):
        fitted([[]], spec, 8)


def _vectors(*vs: list[float]) -> Vectors:
    return Vectors(packed=[pack_vector(v) for v in vs], prompt_tokens=7)


def test_scores_pair_one_to_many_and_many_to_many() -> None:
    one = ScoreRequest(text_1="q", text_2=["a", "b"])
    got = score_response("job-1", "m", one, _vectors([1, 0], [1, 0], [0, 1]))
    assert [round(d.score, 6) for d in got.data] == [1.0, 0.0] and got.usage.prompt_tokens == 7
    many = ScoreRequest(queries=["p", "q"], documents=["a", "b"])
    got = score_response("job-1", "m", many, _vectors([1, 0], [0, 1], [3, 4], [3, 4]))
    assert [round(d.score, 6) for d in got.data] == [0.6, 0.8]
    assert many.job().embed is not None and many.job().embed.texts == ["p", "q", "a", "b"]


def test_scores_that_do_not_pair_are_refused() -> None:
    with pytest.raises(InvalidRequest, match="1:1, 1:N or N:N; got 2:3"):
        ScoreRequest(text_1=["a", "b"], text_2=["a", "b", "c"]).job()
    with pytest.raises(ValidationError, match="text_1 and text_2"):
        ScoreRequest(text_1="a")


def test_rerank_orders_by_score_and_keeps_top_n() -> None:
    req = RerankRequest(query="q", documents=["far", "near", "mid"], top_n=2)
    got = rerank_response("job-1", "m", req, _vectors([1, 0], [0, 1], [1, 0], [1, 1]))
    assert [(r.index, r.document.text) for r in got.results] == [(1, "near"), (2, "mid")]
    assert round(got.results[1].relevance_score, 6) == round(1 / 2 ** 0.5, 6)


def test_rerank_takes_the_fields_cohere_style_clients_send() -> None:
    """LiteLLM always sends ``return_documents`` (null too), the cohere SDK ``max_tokens_per_doc``:
    accepted with vLLM's meaning. max_tokens_per_doc and max_tokens_per_query cut the texts (the
    worker cuts them, as vLLM does); max_chunks_per_doc and rank_fields are ignored, as vLLM ignores
    them; return_documents false leaves the documents out of the results."""
    req = RerankRequest.model_validate({"query": "q", "documents": ["far", "near"], "return_documents": None,
                                        "max_tokens_per_doc": 512, "max_tokens_per_query": 3,
                                        "max_chunks_per_doc": 10, "rank_fields": ["text"]})
    assert req.job().embed is not None and req.job().embed.text_max_tokens == [3, 512, 512]
    got = rerank_response("job-1", "m", req, _vectors([1, 0], [0, 1], [1, 0]))
    assert [r.document.text for r in got.results if r.document] == ["near", "far"]
    bare = RerankRequest(query="q", documents=["far", "near"], return_documents=False)
    assert bare.job().embed is not None and bare.job().embed.text_max_tokens is None  # nothing to cut
    got = rerank_response("job-1", "m", bare, _vectors([1, 0], [0, 1], [1, 0]))
    assert [(r.index, r.document) for r in got.results] == [(1, None), (0, None)]
    assert ScoreRequest(text_1="q", text_2=["a"], max_tokens_per_doc=2).job().embed.text_max_tokens == [0, 2]


def test_texts_are_cut_where_their_nth_token_ends() -> None:
    """The tiny model's tokenizer: a text cut to N tokens is its first N tokens, no more and no fewer."""
    from transformers import AutoTokenizer

    from inferq.shared.settings import Settings
    from inferq.worker.engine.models import resolve_model
    from inferq.worker.jobs.prepare import cut_texts

    tok = AutoTokenizer.from_pretrained(resolve_model(Settings()))
    text = "The quick brown fox jumps over the lazy dog"
    ids = tok.encode(text, add_special_tokens=False)
    cut = cut_texts([text, text, "short"], [3, 0, 50], tok)
    assert tok.encode(cut[0], add_special_tokens=False) == ids[:3] and cut[1:] == [text, "short"]
