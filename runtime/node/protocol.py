"""The OpenAI schema of /v1/chat/completions and /v1/completions as pydantic models: requests, responses
and stream chunks (shaped like vLLM's vllm/entrypoints/openai/protocol.py). vLLM is cited at the
version the neuron image pins, vllm@v0.13.0 (contract.neuron.VLLM_0_13_0; lines read from that wheel).

Every bad input becomes an ApiError (OpenAI's error shape, a 4xx status, the offending `param` and one
line that says how to fix it). Nothing here touches the engine; runtime/node/serving.py turns the
engine's token events into these responses (vLLM keeps protocol.py apart from serving_chat.py too).
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
    model_validator,
)
from pydantic_core import PydanticCustomError

from runtime.node.openai_responses import ErrorInfo, ErrorResponse

Role = Literal["system", "developer", "user", "assistant", "tool"]
ROLES: tuple[str, ...] = get_args(Role)
MAX_STOP = 4
MAX_STOP_LEN = 256
MAX_N = 128  # OpenAI's bound on n (https://platform.openai.com/docs/api-reference/chat/create#chat-create-n)
# vLLM's default max_logprobs (vllm@v0.13.0:vllm/config/model.py:188, checked per request in
# vllm/v1/engine/input_processor.py:68-85): top_logprobs and the completions `logprobs` count may not
# exceed it.
MAX_LOGPROBS = 20

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
]
PlainTextOnly = Annotated[
    Any,
    unsupported("'{field}' is not supported: use 'tools' and 'tool_choice'", allowed=(None, [], "none")),
]


# -- requests -------------------------------------------------------------------------------------------


class OpenAIBaseModel(BaseModel):
    # Fields this unit does not know are ignored: a newer client may send options an older unit lacks.
    model_config = ConfigDict(extra="ignore", frozen=True)


class StreamOptions(OpenAIBaseModel):
    include_usage: Annotated[bool, Strict()] = False


class JsonSchemaFormat(OpenAIBaseModel):
    name: Annotated[str, Strict()] = "response"
    description: Annotated[str | None, Strict()] = None
    # "schema" clashes with a BaseModel attribute, hence the alias (vLLM does the same:
    # vllm@v0.13.0:vllm/entrypoints/openai/protocol.py:181-187). vLLM requires `name` and lets `schema`
    # be missing (then no constraint at all); here `name` defaults and `schema` is required. The neuron
    # engine always sends both (runtime/engines/neuron/requests.py).
    json_schema: Annotated[dict[str, Any], Strict()] = Field(alias="schema")
    strict: Annotated[bool | None, Strict()] = None


class ResponseFormat(OpenAIBaseModel):
    """OpenAI's response_format; vLLM's ResponseFormat takes the same three types
    (vllm@v0.13.0:vllm/entrypoints/openai/protocol.py:214-217)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("json_schema missing")
        return self

    def structured(self) -> dict[str, Any] | None:
        """What the engine constrains the output to (None: plain text)."""
        if self.type == "json_object":
            return {"kind": "json_object"}
        if self.type == "json_schema" and self.json_schema is not None:
            return {"kind": "json_schema", "schema": json.dumps(self.json_schema.json_schema)}
        return None


class FunctionDefinition(OpenAIBaseModel):
    name: Annotated[str, StringConstraints(strict=True, min_length=1, max_length=64)]
    description: Annotated[str | None, Strict()] = None
    parameters: Annotated[dict[str, Any] | None, Strict()] = None


class Tool(OpenAIBaseModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(OpenAIBaseModel):
    name: Annotated[str, Strict()]


class NamedToolChoice(OpenAIBaseModel):
    type: Literal["function"] = "function"
    function: NamedFunction


class FunctionCallIn(OpenAIBaseModel):
    name: Annotated[str, Strict()]
    arguments: Annotated[str, Strict()]


class ToolCallIn(OpenAIBaseModel):
    """A tool call the assistant made earlier in the conversation."""

    id: Annotated[str, Strict()] = ""
    type: Literal["function"] = "function"
    function: FunctionCallIn


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
    tool_calls: Annotated[
        tuple[ToolCallIn, ...] | None,
        explain(
            "'tool_calls' must be a list of "
            '{"id": ..., "type": "function", "function": {"name": ..., "arguments": "..."}}'
        ),
    ] = None
    tool_call_id: Annotated[str | None, Strict(), explain("'tool_call_id' must be a string")] = None
    name: Annotated[str | None, Strict(), explain("'name' must be a string")] = None

    @model_validator(mode="before")
    @classmethod
    def _an_object(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise _reject("each message must be an object with 'role' and 'content'")
        if data.get("content") is None and data.get("role") == "assistant" and data.get("tool_calls"):
            return {**data, "content": ""}  # an assistant turn that only called tools
        return data

    @property
    def text(self) -> str:
        return "".join(part.text for part in self.content)

    def for_template(self) -> dict[str, Any]:
        """The message as a chat template reads it."""
        out: dict[str, Any] = {"role": self.role, "content": self.text}
        if self.tool_calls:
            # Templates index the arguments as a mapping; vLLM parses the JSON string for them too, and
            # makes empty arguments {} (vllm@v0.13.0:vllm/entrypoints/chat_utils.py:1651-1657, run from
            # :1717). It refuses arguments that are not JSON; here they reach the template as the string.
            out["tool_calls"] = [
                {
                    "id": c.id,
                    "type": c.type,
                    "function": {"name": c.function.name, "arguments": _as_json(c.function.arguments)},
                }
                for c in self.tool_calls
            ]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out


def _as_json(text: str) -> Any:
    if not text:
        return {}
    try:
        return json.loads(text)
    except ValueError:
        return text


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
    n: Annotated[Int | None, Field(ge=1, le=MAX_N), explain(f"'n' must be an integer between 1 and {MAX_N}")] = None
    seed: Annotated[Int | None, Field(ge=-(2**63), lt=2**64), explain("'seed' must be a 64-bit integer")] = None
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    response_format: Annotated[
        ResponseFormat | None,
        explain(
            '\'response_format\' must be {"type": "text"}, {"type": "json_object"} or '
            '{"type": "json_schema", "json_schema": {"name": "...", "schema": {...}}}'
        ),
    ] = None
    logit_bias: Annotated[Any, unsupported("'logit_bias' is not supported: leave it out", allowed=(None, {}))] = None
    user: Annotated[str | None, Strict(), explain("'user' must be a string")] = None
    # extension (as in vLLM, vllm@v0.13.0:vllm/entrypoints/openai/protocol.py:572, 1039): generate max_tokens
    # regardless of EOS
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


class _ChatMaxTokens(_Request):
    max_completion_tokens: MaxTokens = None  # OpenAI's newer name for max_tokens

    @model_validator(mode="before")
    @classmethod
    def _newer_name_wins(cls, data: Any) -> Any:
        # Given both, max_completion_tokens counts and max_tokens is not looked at.
        if isinstance(data, dict) and data.get("max_completion_tokens") is not None:
            return {k: v for k, v in data.items() if k != "max_tokens"}
        return data


# What a request that leaves a sampling field out gets: declared here only, sent to the engine in
# every request (engine_host reads them, never defaults them). OpenAI's API reference, "Create
# completion": max_tokens defaults to 16, temperature to 1, top_p to 1; a chat completion's
# max_tokens has no documented default (it is the model's), so a chat answer may run to 512 tokens.
DEFAULT_TEMPERATURE = 1.0
DEFAULT_TOP_P = 1.0
DEFAULT_MAX_TOKENS = {"chat": 512, "completion": 16}


class _Sampling(_Request):
    max_tokens: MaxTokens = None  # None: fill what the context allows, up to DEFAULT_MAX_TOKENS
    temperature: Annotated[
        Number,
        Field(ge=0.0, le=2.0),
        explain("'temperature' must be a number between 0 and 2"),
        null_is(DEFAULT_TEMPERATURE),
    ] = DEFAULT_TEMPERATURE
    top_p: Annotated[
        Number,
        Field(gt=0.0, le=1.0),
        explain("'top_p' must be a number greater than 0 and at most 1"),
        null_is(DEFAULT_TOP_P),
    ] = DEFAULT_TOP_P
    stop: Annotated[
        tuple[Annotated[str, Strict(), Field(max_length=MAX_STOP_LEN)], ...],
        Field(max_length=MAX_STOP),
        explain(f"'stop' must be a string or a list of up to {MAX_STOP} strings of at most {MAX_STOP_LEN} characters"),
        BeforeValidator(_stop_as_list),
        null_is(()),
    ] = ()

    def _sampling(self, max_tokens: int | None, default_max_tokens: int) -> dict[str, Any]:
        out: dict[str, Any] = {
            "max_tokens": max_tokens,
            "default_max_tokens": default_max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
            "stop": [s for s in self.stop if s],
            "ignore_eos": self.ignore_eos,
        }
        # New fields only when set: an engine that does not know them never sees them.
        if self.choices != 1:
            out["n"] = self.choices
        if self.presence_penalty:
            out["presence_penalty"] = self.presence_penalty
        if self.frequency_penalty:
            out["frequency_penalty"] = self.frequency_penalty
        if self.logprobs_count is not None:
            out["logprobs"] = self.logprobs_count
        structured = self.response_format.structured() if self.response_format is not None else None
        if structured is not None:
            out["structured"] = structured
        return out

    @property
    def choices(self) -> int:
        return self.n if self.n is not None else 1

    @property
    def logprobs_count(self) -> int | None:
        """How many alternatives per token the engine reports (None: no logprobs)."""
        raise NotImplementedError


def _tools_list(value: Any) -> Any:
    if value is not None and not isinstance(value, list):
        raise _reject(
            '\'tools\' must be a list of {"type": "function", "function": {"name": ..., "parameters": {...}}}'
        )
    return value


class ChatCompletionRequest(_Sampling, _ChatMaxTokens):
    logprobs: Annotated[bool | None, Strict(), explain("'logprobs' must be true or false")] = None
    top_logprobs: Annotated[
        Int | None,
        Field(ge=0, le=MAX_LOGPROBS),
        explain(f"'top_logprobs' must be an integer between 0 and {MAX_LOGPROBS}"),
    ] = None
    tools: Annotated[
        tuple[
            Annotated[
                Tool,
                explain('each tool must be {"type": "function", "function": {"name": ..., "parameters": {...}}}'),
            ],
            ...,
        ]
        | None,
        BeforeValidator(_tools_list),
    ] = None
    tool_choice: Annotated[
        Literal["none", "auto", "required"] | NamedToolChoice | None,
        explain(
            '\'tool_choice\' must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}'
        ),
    ] = None
    parallel_tool_calls: Annotated[bool | None, Strict(), explain("'parallel_tool_calls' must be true or false")] = None
    functions: PlainTextOnly = None
    function_call: PlainTextOnly = None
    messages: Annotated[
        tuple[ChatMessage, ...],
        _non_empty_list('\'messages\' must be a non-empty list of {"role": ..., "content": ...} objects'),
    ] = Field(None, validate_default=True)

    @model_validator(mode="after")
    def _fields_agree(self) -> ChatCompletionRequest:
        # The rules of vLLM's ChatCompletionRequest (vllm@v0.13.0:vllm/entrypoints/openai/protocol.py:
        # 857-877 check_logprobs, :911-986 check_tool_usage). vLLM has no rule against response_format
        # with tools: for a forced call it sets the call's schema (vllm/tool_parsers/abstract_tool_parser.py:
        # 58-69), then applies response_format to the same structured-output params (protocol.py:785-798),
        # where a json_schema replaces the call's schema and a json_object is set beside it. Here the
        # request is refused instead.
        if self.top_logprobs and not self.logprobs:
            raise _reject("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
        if self.tool_choice is not None and self.tool_choice != "none" and self.tools is None:
            raise _reject("'tool_choice' needs 'tools': give the functions the model may call", param="tool_choice")
        mode = self.tool_mode
        if isinstance(mode, NamedToolChoice) and mode.function.name not in {t.function.name for t in self.tools or ()}:
            raise _reject(
                f"tool_choice names function '{mode.function.name[:64]}', which is not in 'tools'", param="tool_choice"
            )
        if mode == "required":
            try:
                _lift_defs(self.tools or ())
            except _DefsClash as e:
                raise _reject(
                    f"tools give the $defs entry '{str(e)[:64]}' different schemas, and tool_choice 'required' "
                    "needs one: rename it in one tool's parameters",
                    param="tools",
                ) from None
        if mode not in (None, "none") and self.response_format is not None and self.response_format.type != "text":
            raise _reject(
                "'response_format' cannot be combined with tool calls (tool_choice auto, required or a named "
                "function): use one of them, or tool_choice 'none'",
                param="response_format",
            )
        return self

    @property
    def tool_mode(self) -> str | NamedToolChoice | None:
        """None (no tools), "none", "auto", "required" or the named function, resolved as vLLM does:
        tools without tool_choice mean "auto"; "required" with an empty list means "none"
        (vllm@v0.13.0:vllm/entrypoints/openai/protocol.py:914-917, 940-950)."""
        if not self.tools:
            return None if self.tool_choice in (None, "none", "required") else self.tool_choice
        if self.tool_choice is None:
            return "auto"
        return self.tool_choice

    @property
    def forced_tools(self) -> bool:
        return self.tool_mode == "required" or isinstance(self.tool_mode, NamedToolChoice)

    @property
    def logprobs_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def _tool_structure(self) -> dict[str, Any] | None:
        """A forced tool call is generated as JSON: the named function's arguments, or for "required" a
        list of {"name", "parameters"} (the shape vLLM builds and parses back:
        vllm@v0.13.0:vllm/tool_parsers/utils.py:148-193, vllm/entrypoints/openai/serving_engine.py:1453-1465)."""
        mode = self.tool_mode
        tools = self.tools or ()
        if isinstance(mode, NamedToolChoice):
            fn = next(t.function for t in tools if t.function.name == mode.function.name)
            return {"kind": "json_schema", "schema": json.dumps(fn.parameters or {"type": "object"})}
        if mode == "required":
            params, defs = _lift_defs(tools)
            calls: dict[str, Any] = {
                "type": "array",
                "minItems": 1,
                "items": {
                    "anyOf": [
                        {
                            "type": "object",
                            "properties": {
                                "name": {"type": "string", "enum": [t.function.name]},
                                "parameters": p,
                            },
                            "required": ["name", "parameters"],
                            "additionalProperties": False,
                        }
                        for t, p in zip(tools, params, strict=True)
                    ]
                },
            }
            if defs:
                calls["$defs"] = defs
            if self.parallel_tool_calls is False:
                calls["maxItems"] = 1
            return {"kind": "json_schema", "schema": json.dumps(calls)}
        return None

    def engine_payload(self, *, default_max_tokens: int) -> dict[str, Any]:
        max_tokens = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        out = {
            **self._sampling(max_tokens, default_max_tokens),
            "messages": [m.for_template() for m in self.messages],
        }
        if self.tools:
            out["tools"] = [t.model_dump(exclude_none=True) for t in self.tools]
        structure = self._tool_structure()
        if structure is not None:
            out["structured"] = structure
        if self.tool_mode == "auto":
            out["tool_choice"] = "auto"  # the engine checks the model's template teaches a format we parse
        return out


class _DefsClash(ValueError):
    """Two tools define the same "$defs" name differently (the name is the message)."""


def _lift_defs(tools: tuple[Tool, ...]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Each tool's parameters without their "$defs", and those definitions gathered for the root of the
    list-of-calls schema: a "#/$defs/..." reference resolves from the document's root, which the
    parameters no longer are once nested in it. vLLM lifts them the same way and refuses a name two
    tools define differently (vllm@v0.13.0:vllm/tool_parsers/utils.py:160-176, 190-192)."""
    params: list[dict[str, Any]] = []
    defs: dict[str, Any] = {}
    for t in tools:
        p = dict(t.function.parameters or {"type": "object"})
        if isinstance(p.get("$defs"), dict):
            for name, schema in p.pop("$defs").items():
                if defs.setdefault(name, schema) != schema:
                    raise _DefsClash(name)
        params.append(p)
    return params, defs


class CompletionRequest(_Sampling):
    echo: Annotated[Any, unsupported("'echo' is not supported: leave it out", allowed=(None, False))] = None
    suffix: Annotated[Any, unsupported("'suffix' is not supported: leave it out", allowed=(None, ""))] = None
    best_of: Annotated[Int | None, Field(ge=1, le=1), explain("only 'best_of': 1 is supported")] = None
    logprobs: Annotated[
        Int | None, Field(ge=0, le=MAX_LOGPROBS), explain(f"'logprobs' must be an integer between 0 and {MAX_LOGPROBS}")
    ] = None
    prompt: Annotated[
        Annotated[str, StringConstraints(strict=True, min_length=1)]
        | Annotated[tuple[Annotated[Int, Field(ge=0)], ...], Field(min_length=1)],
        explain("'prompt' must be a non-empty string or a non-empty list of non-negative token ids"),
        BeforeValidator(_one_prompt),
    ] = Field(None, validate_default=True)

    @property
    def logprobs_count(self) -> int | None:
        return self.logprobs

    def engine_payload(self, *, default_max_tokens: int) -> dict[str, Any]:
        p = self._sampling(self.max_tokens, default_max_tokens)
        if isinstance(self.prompt, str):
            p["prompt"] = self.prompt
        else:
            p["prompt_ids"] = list(self.prompt)
        return p


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
