"""The operator's model name is checked as a client's is: INFERQ_SERVED_MODEL_NAME, or INFERQ_MODEL
where it is the name (no served name given), must be letters, digits and ._/@+- and at most 256
characters, or the settings, and so the gateway and the worker, refuse to start, naming the
variable. A local folder is named by its path, as vllm serve names it; a path that is no name
needs INFERQ_SERVED_MODEL_NAME."""

from __future__ import annotations

import pydantic
import pytest

from inferq.cli import main as cli
from inferq.shared.keys import MODEL_NAME_MAX_LEN
from inferq.shared.settings import Settings, get_settings


@pytest.fixture(autouse=True)
def no_model_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("INFERQ_MODEL", raising=False)
    monkeypatch.delenv("INFERQ_SERVED_MODEL_NAME", raising=False)


@pytest.mark.parametrize("name", ["my model", "a:b", "m*", "m\n", "é", "x" * (MODEL_NAME_MAX_LEN + 1)])
def test_a_served_name_that_is_no_model_name_is_refused(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(pydantic.ValidationError, match="INFERQ_SERVED_MODEL_NAME"):
        Settings(served_model_name=name)
    monkeypatch.setenv("INFERQ_SERVED_MODEL_NAME", name)
    with pytest.raises(pydantic.ValidationError, match="INFERQ_SERVED_MODEL_NAME"):
        Settings()


@pytest.mark.parametrize("model", ["mistralai/Mistral-7B-Instruct-v0.2", "/srv/models/llama-3.1-8b",
                                   "./models/qwen2.5@main", "m" * MODEL_NAME_MAX_LEN])
def test_a_hub_id_or_a_path_that_is_a_name_is_the_served_name(model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERQ_MODEL", model)
    assert Settings().model_name == model


def test_a_path_that_is_no_name_needs_a_served_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERQ_MODEL", "/srv/models/My Model")
    with pytest.raises(pydantic.ValidationError) as e:
        Settings()
    assert "INFERQ_MODEL '/srv/models/My Model'" in str(e.value) and "set INFERQ_SERVED_MODEL_NAME" in str(e.value)
    monkeypatch.setenv("INFERQ_SERVED_MODEL_NAME", "my-model")
    s = Settings()
    assert (s.model_name, s.model) == ("my-model", "/srv/models/My Model")


@pytest.mark.parametrize("command", ["api", "worker"])
def test_the_gateway_and_the_worker_refuse_to_start(command: str, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    started: list[str] = []
    monkeypatch.setattr(cli, f"cmd_{command}", lambda args: started.append(command) or 0)
    monkeypatch.setenv("INFERQ_MODEL", "/srv/models/My Model")
    get_settings.cache_clear()
    try:
        assert cli.main([command]) == 2 and started == []
    finally:
        get_settings.cache_clear()
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: invalid settings: ") and "INFERQ_MODEL '/srv/models/My Model'" in line
