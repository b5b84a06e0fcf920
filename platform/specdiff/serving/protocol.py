"""OpenAI-compatible request bodies (strictly typed; unknown keys are errors) and the 400 error they raise.

Extensions beyond OpenAI (send them with the ``openai`` client through ``extra_body``): ``gamma`` (window γ),
``num_candidates`` (K), ``draft_temperature``, ``draft_top_k``, ``acceptance``, ``prompt_lookup`` (false = no
candidate copied from the context), ``speculative`` (false = verifier-only decoding) and ``top_k``.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class ApiError(Exception):
    """An HTTP error in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.param, self.status, self.kind = message, param, status, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": None}}


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Request):
    include_usage: bool = False


class _Common(_Request):
    model: str
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float = 1.0
    top_p: float = 1.0
    n: Literal[1] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    user: str | None = None
    presence_penalty: Literal[0, 0.0] = 0
    frequency_penalty: Literal[0, 0.0] = 0
    # specdiff extensions
    top_k: int = 0
    speculative: bool = True
    gamma: int | None = None
    num_candidates: int | None = None
    draft_temperature: float | None = None
    draft_top_k: int = 0
    acceptance: Literal["greedy", "speculative"] = "greedy"
    prompt_lookup: bool = True

    @property
    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class CompletionRequest(_Common):
    prompt: str | list[int]
    echo: Literal[False] = False
    logprobs: None = None
    suffix: None = None


class ContentPart(_Request):
    type: Literal["text"]
    text: str


class ChatMessage(_Request):
    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[ContentPart]
    name: str | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: Literal[False] | None = None


def parse(model: type[BaseModel], body: bytes) -> Any:
    """Raw JSON bytes -> request, or ApiError(400) naming the offending field."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ApiError(f"request body is not valid JSON: {err}", param="body") from None
    if not isinstance(data, dict):
        raise ApiError(f"request body must be a JSON object, got {type(data).__name__}", param="body")
    try:
        return model.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        param = ".".join(str(p) for p in first["loc"] if _is_field(p)) or "body"
        shown = repr(first.get("input"))
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        raise ApiError(f"{param}: {first['msg']}, got {shown}", param=param) from None


_UNION_TAGS = {"str", "int", "float", "bool", "none"}


def _is_field(part) -> bool:
    """Field names and list indices in an error location; not pydantic's union-member tags ('str', 'list[int]')."""
    return isinstance(part, int) or (part.isidentifier() and part.islower() and part not in _UNION_TAGS)


def value_error(err: ValueError) -> ApiError:
    """An engine config error ("gamma must be ..., got 0") as a 400 naming that field."""
    message = str(err)
    param = message.split(" ", 1)[0]
    return ApiError(message, param=param)
