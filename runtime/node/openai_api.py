"""The OpenAI schema of /v1/chat/completions and /v1/completions as pydantic models: requests, responses
and stream chunks (shaped like vLLM's vllm/entrypoints/openai/protocol.py).

Every bad input becomes an ApiError (OpenAI's error shape, a 4xx status, the offending `param` and one
line that says how to fix it). Nothing here touches the engine.
"""

from __future__ import annotations

import json
import zlib
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    Strict,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    WrapValidator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

Role = Literal["system", "developer", "user", "assistant", "tool"]
ROLES: tuple[str, ...] = get_args(Role)
MAX_STOP = 4
MAX_STOP_LEN = 256

_INVALID = "invalid_request"  # the error type every rule below raises
_NOT_FOUND = "model_not_found"


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        type_: str = "invalid_request_error",
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type_, code

    def body(self) -> dict[str, Any]:
        return ErrorResponse(
            error=ErrorInfo(message=self.message, type=self.type, param=self.param, code=self.code)
        ).model_dump()


# -- the body: JSON of any shape is parsed within bounds, or refused as the client's error ---------------

MAX_BODY_DEPTH = 32  # arrays/objects inside each other; a chat request needs 5 (body, messages, message, content, part)
# Content codings a client may compress its body with (RFC 9110 §8.4.1: gzip, and deflate = the zlib
# format of RFC 1950; raw deflate is accepted too, as browsers and aiohttp do).
BODY_ENCODINGS = ("identity", "gzip", "x-gzip", "deflate")


def decode_body(raw: bytes, content_encoding: str, *, limit: int) -> bytes:
    """The body with its Content-Encoding undone (the last coding applied is undone first, RFC 9110
    §8.4), never more than `limit` bytes decoded: a small compressed body may expand without bound."""
    codings = [c.strip().lower() for c in content_encoding.split(",") if c.strip()]
    for coding in reversed(codings):
        if coding == "identity":
            continue
        if coding not in BODY_ENCODINGS:
            raise ApiError(
                415,
                f"Content-Encoding {coding[:40]!r} is not supported: send the body plain, gzip or deflate",
            )
        tries = (16 + zlib.MAX_WBITS,) if coding in ("gzip", "x-gzip") else (zlib.MAX_WBITS, -zlib.MAX_WBITS)
        for wbits in tries:
            inflate = zlib.decompressobj(wbits)
            try:
                out = inflate.decompress(raw, limit + 1)
            except zlib.error:
                continue
            if len(out) > limit or inflate.unconsumed_tail:
                raise ApiError(413, f"the request body is larger than {limit} bytes once decompressed: shorten it")
            if inflate.eof:
                raw = out
                break
        else:
            raise ApiError(400, f"the request body is not complete {coding} data: compress it whole, or send it plain")
    return raw


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def parse_json_body(raw: bytes) -> Any:
    """The request body as JSON (RFC 8259: UTF-8, no NaN/Infinity), nested at most MAX_BODY_DEPTH deep.

    Its size is bounded before this (the server's client_max_size). The charset a client names in
    Content-Type is not trusted: an unknown one must not turn a body into a server error."""
    try:
        body = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "the request body is not valid JSON: send a JSON object") from None
    except RecursionError:  # the parser's own stack: far deeper than MAX_BODY_DEPTH
        raise _too_deep() from None
    # Depth, walked without recursion (the validators and error messages below recurse).
    level = [body]
    for _ in range(MAX_BODY_DEPTH):
        level = [
            child
            for node in level
            if isinstance(node, (list, dict))
            for child in (node.values() if isinstance(node, dict) else node)
            if isinstance(child, (list, dict))
        ]
        if not level:
            return body
    raise _too_deep()


def _too_deep() -> ApiError:
    return ApiError(
        400, f"the request body is nested more than {MAX_BODY_DEPTH} arrays/objects deep: send a flatter JSON object"
    )


# -- rules: each turns a field's bad value into one line naming the field and the fix -------------------


def _reject(message: str, *, param: str | None = None) -> PydanticCustomError:
    # No context dict: pydantic formats `{name}` placeholders only from the context, so the braces
    # of the JSON examples in these messages come out as written.
    return PydanticCustomError(_INVALID, message, {"param": param} if param else None)


def _shown(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:40] + "..."


def _fill(template: str, info: ValidationInfo) -> str:
    """A rule's message with "{field}" (the field's name) and "{max_tokens_limit}" filled in."""
    text = template.replace("{field}", info.field_name or "value")
    if "{max_tokens_limit}" in text:
        text = text.replace("{max_tokens_limit}", str(_context(info)["max_tokens_limit"]))
    return text


def explain(requirement: str) -> WrapValidator:
    """Any error validating the field (type, range, length, missing) becomes `requirement` followed by
    the value sent."""

    def validate(value: Any, handler: Any, info: ValidationInfo) -> Any:
        try:
            return handler(value)
        except ValidationError:
            raise _reject(f"{_fill(requirement, info)}; got {_shown(value)}") from None

    return WrapValidator(validate)


def unsupported(message: str, *, allowed: tuple[Any, ...] = (None,), param: str | None = None) -> AfterValidator:
    """A field this unit does not implement: any value but the neutral ones in `allowed` gets a 400."""

    def validate(value: Any, info: ValidationInfo) -> Any:
        if value not in allowed:
            raise _reject(_fill(message, info), param=param)
        return value

    return AfterValidator(validate)


def null_is(default: Any) -> BeforeValidator:
    """JSON null counts as leaving the field out: the field takes `default`."""
    return BeforeValidator(lambda v: default if v is None else v)


def _context(info: ValidationInfo) -> dict[str, Any]:
    """What parse_chat / parse_completion pass down: the served model and the max_tokens limit."""
    if info.context is None:
        raise RuntimeError("validate requests with parse_chat or parse_completion: they pass the unit's limits")
    return info.context


def _within_limit(value: int | None, info: ValidationInfo) -> int | None:
    if value is not None and value > _context(info)["max_tokens_limit"]:
        raise ValueError("above max_tokens_limit")  # explain() words it
    return value


def _served_model(value: Any, info: ValidationInfo) -> str:
    served = _context(info)["served_model"]
    if not isinstance(value, str) or not value:
        raise _reject(f"'model' is required and must be a string; this unit serves '{served}'")
    if value != served:
        raise PydanticCustomError(_NOT_FOUND, f"The model '{value[:200]}' does not exist; this unit serves '{served}'")
    return value


def _stream_options_need_stream(value: StreamOptions | None, info: ValidationInfo) -> StreamOptions | None:
    if value is not None and info.data.get("stream") is False:
        raise _reject("'stream_options' is only allowed when 'stream' is true")
    return value


def _stop_as_list(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


def _non_empty_list(message: str) -> BeforeValidator:
    """The field must be a non-empty JSON array; its items are then validated (and named) one by one."""

    def validate(value: Any) -> Any:
        if not isinstance(value, list) or not value:
            raise _reject(message)
        return value

    return BeforeValidator(validate)


def _content_as_parts(value: Any) -> Any:
    if isinstance(value, str):
        return [{"type": "text", "text": value}]
    if isinstance(value, list) and value:
        return value
    raise _reject("each message's 'content' must be a string or a non-empty list of text parts")


def _one_prompt(value: Any) -> Any:
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        return value[0]  # a batch of one
    if isinstance(value, list) and len(value) > 1 and not all(type(t) is int for t in value):
        raise _reject("batched prompts are not supported: send one prompt per request")
    return value


Int = Annotated[int, Strict()]  # JSON true, 1.5 and "1" are not integers
Number = Annotated[float, Strict(), Field(allow_inf_nan=False)]  # an int is a number; true is not
MaxTokens = Annotated[
    Int | None,
    Field(ge=1),
    AfterValidator(_within_limit),
    explain("'{field}' must be an integer between 1 and {max_tokens_limit}"),
]
Penalty = Annotated[
    Number,
    Field(ge=-2.0, le=2.0),
    explain("'{field}' must be a number between -2.0 and 2.0"),
    null_is(0.0),
    unsupported("'{field}' is not supported by this engine: leave it out or set it to 0", allowed=(0.0,)),
]
_NO_LOGPROBS = "logprobs are not supported: leave 'logprobs' and 'top_logprobs' out"
PlainTextOnly = Annotated[
    Any, unsupported("'{field}' is not supported: this unit generates plain text", allowed=(None, [], "none"))
]


# -- requests -------------------------------------------------------------------------------------------


class OpenAIBaseModel(BaseModel):
    # Fields this unit does not know are ignored: a newer client may send options an older unit lacks.
    model_config = ConfigDict(extra="ignore", frozen=True)


class StreamOptions(OpenAIBaseModel):
    include_usage: Annotated[bool, Strict()] = False


class TextPart(OpenAIBaseModel):
    type: Literal["text"]
    text: Annotated[str, Strict()]


class ChatMessage(OpenAIBaseModel):
    role: Annotated[Role, explain(f"'role' must be one of {', '.join(ROLES)}")] = Field(None, validate_default=True)
    content: Annotated[
        tuple[
            Annotated[TextPart, explain('only text content parts ({"type": "text", "text": "..."}) are supported')], ...
        ],
        BeforeValidator(_content_as_parts),
    ] = Field(None, validate_default=True)

    @model_validator(mode="before")
    @classmethod
    def _an_object(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise _reject("each message must be an object with 'role' and 'content'")
        return data

    @property
    def text(self) -> str:
        return "".join(part.text for part in self.content)


# Fields are declared in the order they are checked: a request with several bad fields gets the error
# of the first. pydantic orders fields base class first along the MRO, so a chat request checks
# _Request's, then max_completion_tokens, then _Sampling's, then its own.


class _Request(OpenAIBaseModel):
    """What both endpoints share before the sampling settings."""

    model: Annotated[str, PlainValidator(_served_model)] = Field(None, validate_default=True)
    stream: Annotated[bool, Strict(), explain("'stream' must be true or false"), null_is(False)] = False
    stream_options: Annotated[
        StreamOptions | None,
        explain("'stream_options' must be an object like {\"include_usage\": true}"),
        AfterValidator(_stream_options_need_stream),
    ] = None
    n: Annotated[
        Int | None, Field(ge=1, le=1), explain("only 'n': 1 is supported: send one request per completion")
    ] = None
    seed: Annotated[Int | None, Field(ge=-(2**63), lt=2**64), explain("'seed' must be a 64-bit integer")] = None
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    logprobs: Annotated[Any, unsupported(_NO_LOGPROBS, allowed=(None, False), param="logprobs")] = None
    top_logprobs: Annotated[Any, unsupported(_NO_LOGPROBS, param="logprobs")] = None
    logit_bias: Annotated[Any, unsupported("'logit_bias' is not supported: leave it out", allowed=(None, {}))] = None
    user: Annotated[str | None, Strict(), explain("'user' must be a string")] = None
    # extension (as in vLLM): generate max_tokens regardless of EOS
    ignore_eos: Annotated[bool, Strict(), explain("'ignore_eos' must be true or false")] = False

    @model_validator(mode="before")
    @classmethod
    def _an_object(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise _reject("the request body must be a JSON object")
        return data

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def _null_usage(self) -> dict[str, Any]:
        # With stream_options.include_usage every chunk but the last carries `"usage": null`; without it no
        # chunk has the key (https://platform.openai.com/docs/api-reference/chat/create#chat-create-stream_options).
        return {"usage": None} if self.include_usage else {}

    @staticmethod
    def _usage(prompt_tokens: int, completion_tokens: int) -> UsageInfo:
        return UsageInfo(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        )


class _ChatMaxTokens(_Request):
    max_completion_tokens: MaxTokens = None  # OpenAI's newer name for max_tokens

    @model_validator(mode="before")
    @classmethod
    def _newer_name_wins(cls, data: Any) -> Any:
        # Given both, max_completion_tokens counts and max_tokens is not looked at.
        if isinstance(data, dict) and data.get("max_completion_tokens") is not None:
            return {k: v for k, v in data.items() if k != "max_tokens"}
        return data


class _Sampling(_Request):
    max_tokens: MaxTokens = None  # None: fill what the context allows, up to the default
    temperature: Annotated[
        Number, Field(ge=0.0, le=2.0), explain("'temperature' must be a number between 0 and 2"), null_is(1.0)
    ] = 1.0  # OpenAI's default
    top_p: Annotated[
        Number, Field(gt=0.0, le=1.0), explain("'top_p' must be a number greater than 0 and at most 1"), null_is(1.0)
    ] = 1.0
    stop: Annotated[
        tuple[Annotated[str, Strict(), Field(max_length=MAX_STOP_LEN)], ...],
        Field(max_length=MAX_STOP),
        explain(f"'stop' must be a string or a list of up to {MAX_STOP} strings of at most {MAX_STOP_LEN} characters"),
        BeforeValidator(_stop_as_list),
        null_is(()),
    ] = ()

    def _sampling(self, max_tokens: int | None, default_max_tokens: int) -> dict[str, Any]:
        return {
            "max_tokens": max_tokens,
            "default_max_tokens": default_max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
            "stop": [s for s in self.stop if s],
            "ignore_eos": self.ignore_eos,
        }


class ChatCompletionRequest(_Sampling, _ChatMaxTokens):
    tools: PlainTextOnly = None
    functions: PlainTextOnly = None
    tool_choice: PlainTextOnly = None
    function_call: PlainTextOnly = None
    response_format: Annotated[
        Any, unsupported('only {"type": "text"} is supported as \'response_format\'', allowed=(None, {"type": "text"}))
    ] = None
    messages: Annotated[
        tuple[ChatMessage, ...],
        _non_empty_list('\'messages\' must be a non-empty list of {"role": ..., "content": ...} objects'),
    ] = Field(None, validate_default=True)

    def engine_payload(self, *, default_max_tokens: int) -> dict[str, Any]:
        max_tokens = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        return {
            **self._sampling(max_tokens, default_max_tokens),
            "messages": [{"role": m.role, "content": m.text} for m in self.messages],
        }

    def response(
        self, *, rid: str, created: int, text: str, finish_reason: str, prompt_tokens: int, completion_tokens: int
    ) -> ChatCompletionResponse:
        return ChatCompletionResponse(
            id=rid,
            created=created,
            model=self.model,
            choices=[ChatCompletionChoice(message=AssistantMessage(content=text), finish_reason=finish_reason)],
            usage=self._usage(prompt_tokens, completion_tokens),
        )

    def chunk(
        self, *, rid: str, created: int, text: str | None, finish_reason: str | None, first: bool = False
    ) -> ChatCompletionChunk:
        """One streamed piece; the first carries the assistant role."""
        return ChatCompletionChunk(
            id=rid,
            created=created,
            model=self.model,
            choices=[
                ChatCompletionChunkChoice(
                    delta=DeltaMessage(role="assistant" if first else None, content=text), finish_reason=finish_reason
                )
            ],
            **self._null_usage(),
        )

    def usage_chunk(self, *, rid: str, created: int, prompt_tokens: int, completion_tokens: int) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=rid, created=created, model=self.model, choices=[], usage=self._usage(prompt_tokens, completion_tokens)
        )


class CompletionRequest(_Sampling):
    echo: Annotated[Any, unsupported("'echo' is not supported: leave it out", allowed=(None, False))] = None
    suffix: Annotated[Any, unsupported("'suffix' is not supported: leave it out", allowed=(None, ""))] = None
    best_of: Annotated[Int | None, Field(ge=1, le=1), explain("only 'best_of': 1 is supported")] = None
    prompt: Annotated[
        Annotated[str, StringConstraints(strict=True, min_length=1)]
        | Annotated[tuple[Annotated[Int, Field(ge=0)], ...], Field(min_length=1)],
        explain("'prompt' must be a non-empty string or a non-empty list of non-negative token ids"),
        BeforeValidator(_one_prompt),
    ] = Field(None, validate_default=True)

    def engine_payload(self, *, default_max_tokens: int) -> dict[str, Any]:
        p = self._sampling(self.max_tokens, default_max_tokens)
        if isinstance(self.prompt, str):
            p["prompt"] = self.prompt
        else:
            p["prompt_ids"] = list(self.prompt)
        return p

    def response(
        self, *, rid: str, created: int, text: str, finish_reason: str, prompt_tokens: int, completion_tokens: int
    ) -> CompletionResponse:
        return CompletionResponse(
            id=rid,
            created=created,
            model=self.model,
            choices=[CompletionChoice(text=text, finish_reason=finish_reason)],
            usage=self._usage(prompt_tokens, completion_tokens),
        )

    def chunk(
        self, *, rid: str, created: int, text: str | None, finish_reason: str | None, first: bool = False
    ) -> CompletionChunk:
        return CompletionChunk(
            id=rid,
            created=created,
            model=self.model,
            choices=[CompletionChoice(text=text or "", finish_reason=finish_reason)],
            **self._null_usage(),
        )

    def usage_chunk(self, *, rid: str, created: int, prompt_tokens: int, completion_tokens: int) -> CompletionChunk:
        return CompletionChunk(
            id=rid, created=created, model=self.model, choices=[], usage=self._usage(prompt_tokens, completion_tokens)
        )


ParsedRequest = ChatCompletionRequest | CompletionRequest


def _param(loc: tuple[int | str, ...]) -> str | None:
    """pydantic's error location as the `param` OpenAI names: ("messages", 0, "role") -> messages[0].role."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out or None


def _parse(cls: type[_Request], body: Any, served_model: str, max_tokens_limit: int) -> Any:
    try:
        return cls.model_validate(body, context={"served_model": served_model, "max_tokens_limit": max_tokens_limit})
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]  # fields are declared in the order they are checked
    param = (first.get("ctx") or {}).get("param") or _param(first["loc"])
    if first["type"] == _NOT_FOUND:
        raise ApiError(404, first["msg"], param="model", code=_NOT_FOUND) from None
    if first["type"] == _INVALID:
        raise ApiError(400, first["msg"], param=param) from None
    # A field without its own rule: still one line naming it.
    raise ApiError(400, f"'{param}': {first['msg']}", param=param) from None


def parse_chat(body: Any, *, served_model: str, max_tokens_limit: int) -> ChatCompletionRequest:
    return _parse(ChatCompletionRequest, body, served_model, max_tokens_limit)


def parse_completion(body: Any, *, served_model: str, max_tokens_limit: int) -> CompletionRequest:
    return _parse(CompletionRequest, body, served_model, max_tokens_limit)


# -- responses ------------------------------------------------------------------------------------------


class UsageInfo(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatCompletionChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str
    logprobs: None = None


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

    @model_serializer
    def _only_what_changed(self) -> dict[str, Any]:
        # A delta carries only what it adds: the role once, then text.
        return {k: v for k, v in (("role", self.role), ("content", self.content)) if v is not None}


class ChatCompletionChunkChoice(BaseModel):
    index: int = 0
    delta: DeltaMessage
    finish_reason: str | None
    logprobs: None = None


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
    logprobs: None = None


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
