"""OpenAI request validation and response shapes for /v1/chat/completions and /v1/completions.

Every bad input becomes an ApiError (OpenAI's error shape, a 4xx status, the offending `param`
and a message that says how to fix it). Nothing here touches the engine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_STOP = 4
MAX_STOP_LEN = 256


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None,
                 type_: str = "invalid_request_error", code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type_, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class ParsedRequest:
    kind: str                            # "chat" | "completion"
    model: str
    stream: bool
    include_usage: bool
    max_tokens: int | None               # None: fill what the context allows, up to the default
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...]
    ignore_eos: bool = False             # extension (as in vLLM): generate max_tokens regardless of EOS
    messages: tuple[dict, ...] = ()      # chat
    prompt: str | None = None            # completion, text
    prompt_ids: tuple[int, ...] | None = None  # completion, token ids

    def engine_payload(self, *, default_max_tokens: int) -> dict[str, Any]:
        p: dict[str, Any] = {"max_tokens": self.max_tokens, "default_max_tokens": default_max_tokens,
                             "temperature": self.temperature, "top_p": self.top_p, "seed": self.seed,
                             "stop": list(self.stop), "ignore_eos": self.ignore_eos}
        if self.kind == "chat":
            p["messages"] = [dict(m) for m in self.messages]
        elif self.prompt_ids is not None:
            p["prompt_ids"] = list(self.prompt_ids)
        else:
            p["prompt"] = self.prompt
        return p


def _bad(param: str, message: str) -> ApiError:
    return ApiError(400, message, param=param)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def _opt_num(body: dict, name: str, default: float, lo: float, hi: float, *, lo_open: bool = False) -> float:
    v = body.get(name)
    if v is None:
        return default
    if not _is_num(v):
        raise _bad(name, f"'{name}' must be a number between {lo} and {hi}; got {type(v).__name__} {v!r:.40}")
    if v < lo or v > hi or (lo_open and v == lo):
        rng = f"greater than {lo} and at most {hi}" if lo_open else f"between {lo} and {hi}"
        raise _bad(name, f"'{name}' must be {rng}; got {v}")
    return float(v)


def _max_tokens(body: dict, limit: int, names: tuple[str, ...]) -> int | None:
    for name in names:
        v = body.get(name)
        if v is None:
            continue
        if not _is_int(v):
            raise _bad(name, f"'{name}' must be an integer between 1 and {limit}; got {type(v).__name__} {v!r:.40}")
        if not 1 <= v <= limit:
            raise _bad(name, f"'{name}' must be between 1 and {limit}; got {v}")
        return v
    return None


def _stop(body: dict) -> tuple[str, ...]:
    v = body.get("stop")
    if v is None:
        return ()
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise _bad("stop", "'stop' must be a string or a list of up to 4 strings")
    if len(items) > MAX_STOP:
        raise _bad("stop", f"'stop' may hold at most {MAX_STOP} strings; got {len(items)}")
    if any(len(s) > MAX_STOP_LEN for s in items):
        raise _bad("stop", f"each stop string may be at most {MAX_STOP_LEN} characters")
    return tuple(s for s in items if s)


def _common(body: Any, served_model: str, limit: int, kind: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("model", f"'model' is required and must be a string; this unit serves '{served_model}'")
    if model != served_model:
        raise ApiError(404, f"The model '{model[:200]}' does not exist; this unit serves '{served_model}'",
                       param="model", code="model_not_found")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _bad("stream", "'stream' must be true or false")
    so = body.get("stream_options")
    include_usage = False
    if so is not None:
        if not isinstance(so, dict) or not isinstance(so.get("include_usage", False), bool):
            raise _bad("stream_options", "'stream_options' must be an object like {\"include_usage\": true}")
        if not stream:
            raise _bad("stream_options", "'stream_options' is only allowed when 'stream' is true")
        include_usage = bool(so.get("include_usage", False))
    n = body.get("n")
    if n is not None and (not _is_int(n) or n != 1):
        raise _bad("n", "only 'n': 1 is supported; send one request per completion")
    seed = body.get("seed")
    if seed is not None and (not _is_int(seed) or not -(2**63) <= seed < 2**64):
        raise _bad("seed", "'seed' must be an integer")
    for name in ("presence_penalty", "frequency_penalty"):
        if _opt_num(body, name, 0.0, -2.0, 2.0) != 0.0:
            raise _bad(name, f"'{name}' is not supported by this engine: leave it out or set it to 0")
    if body.get("logprobs") not in (None, False) or body.get("top_logprobs") is not None:
        raise _bad("logprobs", "logprobs are not supported: leave 'logprobs' out")
    if body.get("logit_bias") not in (None, {}):
        raise _bad("logit_bias", "'logit_bias' is not supported: leave it out")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise _bad("user", "'user' must be a string")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise _bad("ignore_eos", "'ignore_eos' must be true or false")
    names = ("max_completion_tokens", "max_tokens") if kind == "chat" else ("max_tokens",)
    return dict(
        model=model, stream=stream, include_usage=include_usage, max_tokens=_max_tokens(body, limit, names),
        temperature=_opt_num(body, "temperature", 1.0, 0.0, 2.0),  # OpenAI's default
        top_p=_opt_num(body, "top_p", 1.0, 0.0, 1.0, lo_open=True), seed=seed, stop=_stop(body),
        ignore_eos=ignore_eos,
    )


def _content_text(i: int, content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise _bad(f"messages[{i}].content[{j}]", "only text content parts "
                           "({\"type\": \"text\", \"text\": \"...\"}) are supported")
            parts.append(part["text"])
        return "".join(parts)
    raise _bad(f"messages[{i}].content", "each message's 'content' must be a string or a non-empty list of text parts")


def parse_chat(body: Any, *, served_model: str, max_tokens_limit: int) -> ParsedRequest:
    c = _common(body, served_model, max_tokens_limit, "chat")
    for name in ("tools", "functions", "tool_choice", "function_call"):
        if body.get(name) not in (None, [], "none"):
            raise _bad(name, f"'{name}' is not supported: this unit generates plain text")
    rf = body.get("response_format")
    if rf is not None and rf != {"type": "text"}:
        raise _bad("response_format", "only {\"type\": \"text\"} is supported as 'response_format'")
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise _bad("messages", "'messages' must be a non-empty list of {\"role\": ..., \"content\": ...} objects")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise _bad(f"messages[{i}]", "each message must be an object with 'role' and 'content'")
        role = m.get("role")
        if role not in ROLES:
            raise _bad(f"messages[{i}].role", f"'role' must be one of {', '.join(ROLES)}; got {str(role)[:40]!r}")
        out.append({"role": role, "content": _content_text(i, m.get("content"))})
    return ParsedRequest(kind="chat", messages=tuple(out), **c)


def parse_completion(body: Any, *, served_model: str, max_tokens_limit: int) -> ParsedRequest:
    c = _common(body, served_model, max_tokens_limit, "completion")
    if body.get("echo") not in (None, False):
        raise _bad("echo", "'echo' is not supported: leave it out")
    if body.get("suffix") not in (None, ""):
        raise _bad("suffix", "'suffix' is not supported: leave it out")
    bo = body.get("best_of")
    if bo is not None and (not _is_int(bo) or bo != 1):
        raise _bad("best_of", "only 'best_of': 1 is supported")
    p = body.get("prompt")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]  # a batch of one
    if isinstance(p, str):
        if not p:
            raise _bad("prompt", "'prompt' must not be empty")
        return ParsedRequest(kind="completion", prompt=p, **c)
    if isinstance(p, list) and p and all(_is_int(t) for t in p):
        if any(t < 0 for t in p):
            raise _bad("prompt", "prompt token ids must be non-negative integers")
        return ParsedRequest(kind="completion", prompt_ids=tuple(p), **c)
    if isinstance(p, list) and len(p) > 1:
        raise _bad("prompt", "batched prompts are not supported: send one prompt per request")
    raise _bad("prompt", "'prompt' must be a non-empty string or a non-empty list of token ids")
