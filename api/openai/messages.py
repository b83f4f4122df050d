"""What a chat request holds besides its sampling: its messages, and the tools it offers the model
(their definitions, and the choice of one). Tool calling itself: api/openai/tools.py."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from inferq.shared.schemas import ChatMessage, ToolCall


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


class OpenAIMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None  # an assistant turn may have none
    name: str | None = Field(default=None, min_length=1, max_length=256,
                             description="Passed to the model's chat template as `message.name`.")
    tool_calls: list[ToolCall] | None = Field(default=None, max_length=128, description="An assistant "
                                              "turn's calls; passed to the chat template.")
    tool_call_id: str | None = Field(default=None, max_length=256, description="A tool turn: the call "
                                     "whose result it holds.")

    def to_chat(self) -> ChatMessage:
        content = self.content or ""
        text = content if isinstance(content, str) else "".join(p.text for p in content)
        role = "system" if self.role == "developer" else self.role
        return ChatMessage(role=role, content=text, name=self.name, tool_calls=self.tool_calls or None,
                           tool_call_id=self.tool_call_id)


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$", description="1 to 64 letters, digits, _ . -")
    description: str | None = None
    parameters: dict[str, Any] | None = Field(default=None, description="A JSON schema of the arguments "
                                              "(default: an object with any properties).")
    strict: bool | None = None


class ToolDef(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: NamedFunction

