"""Response assembly for /v1/chat/completions and /v1/completions: the engine's token events turned
into OpenAI's responses, stream chunks and usage, with tool calls and logprobs (as vLLM's
vllm/entrypoints/openai/serving_chat.py and serving_completion.py do, apart from the schema in its
protocol.py; here runtime/node/protocol.py). vLLM is cited at vllm@v0.13.0, as in protocol.py.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from runtime.node import tool_calls
from runtime.node.engine_protocol import Token
from runtime.node.openai_responses import (
    AssistantMessage,
    ChatCompletionChoice,
    ChatCompletionChunk,
    ChatCompletionChunkChoice,
    ChatCompletionResponse,
    CompletionChoice,
    CompletionChunk,
    CompletionResponse,
    DeltaMessage,
    PromptTokensDetails,
    UsageInfo,
)
from runtime.node.protocol import ChatCompletionRequest, CompletionRequest, NamedToolChoice, ParsedRequest


def _tool_call(name: str, arguments: str) -> dict[str, Any]:
    # vLLM's random tool-call id shape, "chatcmpl-tool-" and hex (vllm@v0.13.0:vllm/entrypoints/chat_utils.py:
    # 1898-1903); its random_uuid gives 16 hex digits (vllm/utils/__init__.py:41-42), these 32: clients
    # treat the id as opaque and only echo it back.
    return {
        "id": f"chatcmpl-tool-{uuid.uuid4().hex}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def _lp(value: float) -> float:
    # -inf is not JSON: vLLM clamps to -9999.0 (vllm@v0.13.0:vllm/entrypoints/openai/serving_chat.py:1672,
    # 1726; serving_completion.py:680, 698).
    return max(value, -9999.0)


def _chat_logprob(e: dict[str, Any]) -> dict[str, Any]:
    """One token in the chat shape: token, logprob, UTF-8 bytes, top alternatives
    (https://platform.openai.com/docs/api-reference/chat/object#chat/object-choices; bytes as vLLM
    makes them, vllm@v0.13.0:vllm/entrypoints/openai/serving_chat.py:1673, 1727-1731).

    top_logprobs are the k likeliest tokens, best first, as OpenAI documents them. vLLM 0.13.0 differs:
    it takes the first k of {sampled token, top 1, ..., top k} (serving_chat.py:1655-1677 over the
    dict vllm/logprobs.py:189-205 builds), so a sampled token outside the top k displaces the k-th."""
    return {
        "token": e["token"],
        "logprob": _lp(e["logprob"]),
        "bytes": list(e["token"].encode("utf-8", errors="replace")),
        "top_logprobs": [
            {"token": t, "logprob": _lp(lp), "bytes": list(t.encode("utf-8", errors="replace"))} for t, lp in e["top"]
        ],
    }


def _completion_logprobs(entries: list[dict[str, Any]], offset: int) -> dict[str, Any]:
    """Tokens in the legacy completions shape: parallel lists, and per token a {token: logprob} map of
    the top alternatives plus the sampled token, so up to logprobs + 1 entries
    (https://platform.openai.com/docs/api-reference/completions/object; vLLM the same:
    vllm@v0.13.0:vllm/entrypoints/openai/serving_completion.py:633-715). Where two tokens render alike,
    vLLM's map keeps the one it meets last (its order: sampled token, then top 1..k); here the likelier."""
    out: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for e in entries:
        out["tokens"].append(e["token"])
        out["token_logprobs"].append(_lp(e["logprob"]))
        top: dict[str, float] = {}
        for t, lp in [*e["top"], (e["token"], e["logprob"])]:
            top.setdefault(t, _lp(lp))  # tokens that render alike (partial UTF-8): the likelier one stays
        out["top_logprobs"].append(top)
        out["text_offset"].append(offset)
        offset += len(e["token"])
    return out


@dataclass
class _Choice:
    index: int
    text: list[str] = field(default_factory=list)
    tokens: int = 0
    finish_reason: str | None = None
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    offset: int = 0  # characters of this choice's tokens streamed so far (completions text_offset)
    sent: int = 0  # characters of this choice's text streamed as content (tool_choice "auto")


@dataclass
class Collected:
    """The choices of one request as their token events arrive (events carry their choice's index)."""

    choices: list[_Choice]
    tool_parser: str | None = None  # the model's tool-call format, named by the engine's first event

    def add(self, ev: Token) -> _Choice:
        self.tool_parser = ev.tool_parser or self.tool_parser
        c = self.choices[ev.index]
        c.text.append(ev.text)
        c.tokens += ev.token_id >= 0  # -1: a finish-only event (neuron engine), not a token
        if ev.finish_reason:
            c.finish_reason = ev.finish_reason
        if ev.logprobs is not None:
            c.logprobs.append(ev.logprobs)
        return c

    @property
    def whole(self) -> bool:
        """Every choice has the engine's finish reason: only then is the answer complete."""
        return all(c.finish_reason for c in self.choices)

    @property
    def completion_tokens(self) -> int:
        """Every choice's tokens: with n > 1 usage counts them all, as OpenAI bills them."""
        return sum(c.tokens for c in self.choices)


class _Serving:
    """What both endpoints share: the request being answered, its choices and its usage."""

    def __init__(self, req: Any) -> None:
        self.req = req

    def collector(self) -> Collected:
        return Collected([_Choice(i) for i in range(self.req.choices)])

    def _null_usage(self) -> dict[str, Any]:
        # With stream_options.include_usage every chunk but the last carries `"usage": null`; without it no
        # chunk has the key (https://platform.openai.com/docs/api-reference/chat/create#chat-create-stream_options).
        return {"usage": None} if self.req.include_usage else {}

    @staticmethod
    def _usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> UsageInfo:
        return UsageInfo(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
        )


class ChatServing(_Serving):
    req: ChatCompletionRequest

    def _tool_calls(self, text: str) -> list[dict[str, Any]] | None:
        """The forced tool call(s) in a choice's generated text (None when the text is not one, e.g. cut
        off by max_tokens)."""
        mode = self.req.tool_mode
        if isinstance(mode, NamedToolChoice):
            return [_tool_call(mode.function.name, text)]
        if mode == "required":
            try:
                calls = json.loads(text)
                return [_tool_call(c["name"], json.dumps(c["parameters"], ensure_ascii=False)) for c in calls]
            except (ValueError, TypeError, KeyError):
                return None
        return None

    def _split(self, text: str, collected: Collected) -> tuple[str | None, list[dict[str, Any]] | None]:
        """A finished choice's text as (content, tool calls)."""
        if self.req.forced_tools:
            calls = self._tool_calls(text)
            return (None if calls else text), calls
        if self.req.tool_mode == "auto" and collected.tool_parser:
            content, found = tool_calls.parse(collected.tool_parser, text)
            return content, [_tool_call(c["name"], c["arguments"]) for c in found] or None
        return text, None

    def _finish(self, choice: _Choice, calls: list[dict[str, Any]] | None) -> str:
        # OpenAI (and vLLM, vllm@v0.13.0:vllm/entrypoints/openai/serving_chat.py:1545-1561): "tool_calls"
        # when "auto" or "required" made calls, "stop" for a named function.
        if calls and (
            self.req.tool_mode == "auto" or (self.req.tool_mode == "required" and choice.finish_reason == "stop")
        ):
            return "tool_calls"
        return choice.finish_reason or "stop"

    def response(
        self, *, rid: str, created: int, collected: Collected, prompt_tokens: int, cached_tokens: int = 0
    ) -> ChatCompletionResponse:
        choices = []
        for c in collected.choices:
            content, calls = self._split("".join(c.text), collected)
            choices.append(
                ChatCompletionChoice(
                    index=c.index,
                    message=AssistantMessage(content=content, tool_calls=calls),
                    finish_reason=self._finish(c, calls),
                    logprobs={"content": [_chat_logprob(e) for e in c.logprobs]} if self.req.logprobs else None,
                )
            )
        return ChatCompletionResponse(
            id=rid,
            created=created,
            model=self.req.model,
            choices=choices,
            usage=self._usage(prompt_tokens, collected.completion_tokens, cached_tokens),
        )

    def opening(self, *, rid: str, created: int) -> list[ChatCompletionChunk]:
        """The first chunk of each choice carries the assistant role."""
        return [
            self._chunk(
                rid,
                created,
                ChatCompletionChunkChoice(
                    index=i, delta=DeltaMessage(role="assistant", content=""), finish_reason=None
                ),
            )
            for i in range(self.req.choices)
        ]

    def _chunk(self, rid: str, created: int, choice: ChatCompletionChunkChoice) -> ChatCompletionChunk:
        """A streamed chunk of one choice (vLLM streams each of the n choices in its own chunks)."""
        return ChatCompletionChunk(
            id=rid, created=created, model=self.req.model, choices=[choice], **self._null_usage()
        )

    def chunks(self, *, rid: str, created: int, ev: Token, collected: Collected) -> list[ChatCompletionChunk]:
        """What one token event adds to the stream. A forced tool call is sent whole with its choice's
        finish (its JSON arguments are only a call once complete)."""
        choice = collected.add(ev)
        finish = ev.finish_reason
        entry = [_chat_logprob(ev.logprobs)] if self.req.logprobs and ev.logprobs is not None else []
        if self.req.forced_tools:
            if not finish:
                return []
            text = "".join(choice.text)
            calls = self._tool_calls(text)
            delta = DeltaMessage(
                content=None if calls else text,
                tool_calls=[{"index": k, **call} for k, call in enumerate(calls)] if calls else None,
            )
            entry = [_chat_logprob(e) for e in choice.logprobs] if self.req.logprobs else []
            finish = self._finish(choice, calls)
        elif self.req.tool_mode == "auto" and collected.tool_parser:
            # Content streams until the text may be turning into a call; a call goes out whole at the end.
            text = "".join(choice.text)
            if finish:
                content, calls = self._split(text, collected)
                end = len(content or "") if calls else len(text)
                delta = DeltaMessage(
                    content=text[choice.sent : end] if end > choice.sent else None,
                    tool_calls=[{"index": k, **call} for k, call in enumerate(calls)] if calls else None,
                )
                finish = self._finish(choice, calls)
            else:
                safe = tool_calls.streamable(collected.tool_parser, text)
                if safe <= choice.sent and not entry:
                    return []
                delta = DeltaMessage(content=text[choice.sent : safe] if safe > choice.sent else None)
                choice.sent = max(choice.sent, safe)
        else:
            delta = DeltaMessage(content=ev.text)
        return [
            self._chunk(
                rid,
                created,
                ChatCompletionChunkChoice(
                    index=choice.index,
                    delta=delta,
                    finish_reason=finish,
                    logprobs={"content": entry} if self.req.logprobs else None,
                ),
            )
        ]

    def usage_chunk(
        self, *, rid: str, created: int, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0
    ) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=rid,
            created=created,
            model=self.req.model,
            choices=[],
            usage=self._usage(prompt_tokens, completion_tokens, cached_tokens),
        )


class CompletionServing(_Serving):
    req: CompletionRequest

    def response(
        self, *, rid: str, created: int, collected: Collected, prompt_tokens: int, cached_tokens: int = 0
    ) -> CompletionResponse:
        return CompletionResponse(
            id=rid,
            created=created,
            model=self.req.model,
            choices=[
                CompletionChoice(
                    index=c.index,
                    text="".join(c.text),
                    finish_reason=c.finish_reason or "stop",
                    logprobs=_completion_logprobs(c.logprobs, 0) if self.req.logprobs is not None else None,
                )
                for c in collected.choices
            ],
            usage=self._usage(prompt_tokens, collected.completion_tokens, cached_tokens),
        )

    def opening(self, *, rid: str, created: int) -> list[CompletionChunk]:
        return []

    def chunks(self, *, rid: str, created: int, ev: Token, collected: Collected) -> list[CompletionChunk]:
        choice = collected.add(ev)
        logprobs = None
        if self.req.logprobs is not None:
            entries = [ev.logprobs] if ev.logprobs is not None else []
            logprobs = _completion_logprobs(entries, choice.offset)
            choice.offset += sum(len(e["token"]) for e in entries)
        return [
            CompletionChunk(
                id=rid,
                created=created,
                model=self.req.model,
                choices=[
                    CompletionChoice(
                        index=choice.index,
                        text=ev.text or "",
                        finish_reason=ev.finish_reason,
                        logprobs=logprobs,
                    )
                ],
                **self._null_usage(),
            )
        ]

    def usage_chunk(
        self, *, rid: str, created: int, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0
    ) -> CompletionChunk:
        return CompletionChunk(
            id=rid,
            created=created,
            model=self.req.model,
            choices=[],
            usage=self._usage(prompt_tokens, completion_tokens, cached_tokens),
        )


def serving_for(req: ParsedRequest) -> ChatServing | CompletionServing:
    """The assembly of a parsed request's responses."""
    return ChatServing(req) if isinstance(req, ChatCompletionRequest) else CompletionServing(req)
