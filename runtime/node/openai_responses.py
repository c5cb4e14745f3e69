"""The OpenAI schema of what /v1/chat/completions and /v1/completions answer: responses, stream chunks
and the error body (shaped like vLLM's vllm/entrypoints/openai/protocol.py, as runtime/node/protocol.py
shapes the requests). runtime/node/serving.py fills them from the engine's token events.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, model_serializer


class PromptTokensDetails(BaseModel):
    # Prompt tokens whose KV came from the unit's prefix cache. OpenAI always sends the object
    # (https://platform.openai.com/docs/api-reference/chat/object#chat/object-usage); vLLM sends the
    # same field when started with --enable-prompt-tokens-details (its PromptTokenUsageInfo).
    cached_tokens: int = 0


class UsageInfo(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = PromptTokensDetails()


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[dict[str, Any]] | None = None

    @model_serializer(mode="wrap")
    def _tool_calls_only_when_made(self, handler: Any) -> dict[str, Any]:
        out = handler(self)
        if self.tool_calls is None:
            out.pop("tool_calls", None)
        return out


class ChatCompletionChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str
    logprobs: dict[str, Any] | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatCompletionChoice]
    usage: UsageInfo


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None

    @model_serializer
    def _only_what_changed(self) -> dict[str, Any]:
        # A delta carries only what it adds: the role once, then text (or the tool calls).
        fields = (("role", self.role), ("content", self.content), ("tool_calls", self.tool_calls))
        return {k: v for k, v in fields if v is not None}


class ChatCompletionChunkChoice(BaseModel):
    index: int = 0
    delta: DeltaMessage
    finish_reason: str | None
    logprobs: dict[str, Any] | None = None


class _Chunk(BaseModel):
    @model_serializer(mode="wrap")
    def _usage_only_when_set(self, handler: Any) -> dict[str, Any]:
        out = handler(self)
        if "usage" not in self.model_fields_set:
            out.pop("usage", None)
        return out


class ChatCompletionChunk(_Chunk):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatCompletionChunkChoice]
    usage: UsageInfo | None = None


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: str | None
    logprobs: dict[str, Any] | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo


class CompletionChunk(_Chunk):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    error: ErrorInfo
