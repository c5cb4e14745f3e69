"""What the neuron engine forwards to the vLLM server in its image, and what it refuses first.

The leader validates every field against OpenAI's schema; this module decides which of them the
pinned vLLM can actually honour in the unit's mode, builds the /v1/completions body for the V1
plugin's OpenAI server, and turns its streamed chunks back into token ids (the engine cuts the text).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from runtime.engines.base import GenerationRequest, RequestRejected, SamplingParams, TokenEvent, TokenLogprob

# Every source below is at the revision the single-node image pins (contract/neuron.py): vLLM as
# vllm-project/vllm@v0.13.0 (lines read from the pinned wheel, contract.neuron.VLLM_0_13_0, whose .py
# files are the tag's) and the plugin as vllm-project/vllm-neuron@4fac6b7b (branch release-0.4.1,
# contract.neuron.PLUGIN_0_4_1); "runner" and "loader" are its vllm_neuron/worker/
# neuronx_distributed_model_{runner,loader}.py.
# vLLM 0.13.0's /v1/completions request schema (vllm@v0.13.0:vllm/entrypoints/openai/protocol.py,
# CompletionRequest :1010-1345): frequency_penalty :1016, logprobs :1018, max_tokens :1019, n :1020,
# presence_penalty :1021, seed :1022, stop :1023, response_format :1057-1064 (json_object / json_schema
# become structured outputs, :1213-1237), return_tokens_as_token_ids :1099, return_token_ids :1107.
# Its default max_logprobs is 20 (vllm/config/model.py:188), checked per request
# (vllm/v1/engine/input_processor.py:68-85).
VLLM_MAX_LOGPROBS = 20


@dataclass(frozen=True)
class Serves:
    """The fields the unit's vLLM honours, and how to name the mode in a refusal."""

    mode: str
    n: bool
    logprobs: bool
    structured: bool
    penalties: bool
    fix: str  # what the operator can change to get the refused fields


def serves(*, multi_node: bool, sampling: str) -> Serves:
    if multi_node:
        # Multi-node units run NxD Inference under flotilla's own loop (spmd.py): one sequence per
        # request, sampled on the leader from the logits with the request's top_k / top_p /
        # temperature; no log-probabilities, grammar or penalties are applied there yet.
        return Serves(
            mode="a multi-node unit (NxD Inference loop)",
            n=False,
            logprobs=False,
            structured=False,
            penalties=False,
            fix="send it to a single-node unit",
        )
    if sampling == "cpu":
        # on_device_sampling_config None: the runner hands the logits to vLLM's own Sampler
        # (runner:247-268), after the structured-output bitmask (:252-260); that sampler applies the
        # penalties and computes logprobs, which the runner returns (:892-901).
        return Serves("cpu sampling", n=True, logprobs=True, structured=True, penalties=True, fix="")
    # On-device sampling is the plugin's default (loader:1067-1069, :1100). Only top_k, top_p and
    # temperature reach the device (runner:1733-1763; plugin README.md:182-189), top_k capped at
    # 256 (runner :113, :1739). It returns no logprobs (loader :542-550), which vLLM's stream
    # asserts on (vllm@v0.13.0:vllm/entrypoints/openai/serving_completion.py:428-429), and drops the
    # grammar bitmask with only a warning (runner :229-241). vLLM fans n out into n child requests
    # before sampling (vllm@v0.13.0:vllm/v1/engine/async_llm.py:319-336), so n still works.
    return Serves(
        mode="on-device sampling",
        n=True,
        logprobs=False,
        structured=False,
        penalties=False,
        fix="set FLOTILLA_NEURON_SAMPLING=cpu on the unit",
    )


def check(sp: SamplingParams, s: Serves) -> None:
    """Refuse what the unit's vLLM would refuse or silently ignore: one line naming the field and the fix."""

    def refuse(field: str, what: str) -> RequestRejected:
        fix = f"; {s.fix}" if s.fix else ""
        return RequestRejected(f"'{field}' is not served by the neuron engine in {s.mode}: {what}{fix}", param=field)

    if sp.n > 1 and not s.n:
        raise refuse("n", "leave it out or set it to 1, and send one request per completion")
    if sp.n > 1 and sp.temperature <= 0:
        # vLLM samples greedily only at temperature 0 (it first raises any temperature in (0, 0.01) to
        # 0.01, then treats what is below 1e-5 as greedy) and refuses n > 1 there
        # (vllm@v0.13.0:vllm/sampling_params.py:316-324, 353-358, 449-451).
        raise RequestRejected(
            f"n {sp.n} with temperature 0 is refused by vLLM (greedy sampling allows one choice): "
            "set a temperature above 0 or n to 1",
            param="n",
        )
    if sp.logprobs is not None and not s.logprobs:
        raise refuse("logprobs", "it returns no log-probabilities; leave 'logprobs' out")
    if sp.logprobs is not None and sp.logprobs > VLLM_MAX_LOGPROBS:
        raise RequestRejected(f"logprobs {sp.logprobs} is above vLLM's limit of {VLLM_MAX_LOGPROBS}", param="logprobs")
    if sp.structured is not None and not s.structured:
        raise refuse("response_format", "it cannot constrain the output; leave it out (forced tool calls need it too)")
    if sp.seed is not None and sp.temperature > 0:
        # No neuron mode seeds a request. The plugin's runner builds every request with generator=None
        # (runner:986-997) where vLLM's GPU runner seeds a torch.Generator from the request's seed
        # (vllm@v0.13.0:vllm/v1/worker/gpu_model_runner.py:809-816), so its host sampler draws from the
        # global RNG; the device sampler takes no seed at all (runner:1733-1763); the multi-node loop's neither.
        # vLLM would accept the seed and sample unseeded.
        raise RequestRejected(
            f"'seed' is not served by the neuron engine in {s.mode}: its sampler takes no per-request seed, "
            "so the output would not be reproducible; leave 'seed' out or use temperature 0",
            param="seed",
        )
    if (sp.presence_penalty or sp.frequency_penalty) and not s.penalties:
        field = "presence_penalty" if sp.presence_penalty else "frequency_penalty"
        raise refuse(field, "it does not apply penalties; leave it out or set it to 0")


def check_continuation(request: GenerationRequest) -> None:
    """Refuse a continuation (prompt + the tokens another unit generated) that vLLM cannot go on with
    exactly: it takes those tokens as prompt, so what it keeps over the generated tokens only starts
    afresh. Its grammar advances on sampled tokens only (vllm@v0.13.0:vllm/v1/core/sched/scheduler.py:1170,
    accept_tokens on each step's new tokens), and presence / frequency penalties count output tokens only
    (vllm/model_executor/layers/utils.py:83-95)."""
    if not request.generated:
        return
    sp = request.sampling
    if sp.n != 1:
        raise RequestRejected("a single-node neuron unit continues one choice only: n must be 1", param="n")
    if sp.structured is not None:
        raise RequestRejected(
            "a single-node neuron unit cannot continue a response_format answer: vLLM would start its grammar "
            "afresh after the tokens already generated",
            param="response_format",
        )
    if sp.presence_penalty or sp.frequency_penalty:
        raise RequestRejected(
            "a single-node neuron unit cannot continue an answer with penalties: vLLM counts only the tokens "
            "it generated itself",
            param="presence_penalty" if sp.presence_penalty else "frequency_penalty",
        )


def completions_body(request: GenerationRequest, model_name: str, *, usage: bool = False) -> dict[str, Any]:
    """The streamed /v1/completions request for vLLM 0.13.0's OpenAI server: the prompt as token ids
    (vllm@v0.13.0:vllm/entrypoints/openai/protocol.py:1014), after it a continuation's generated tokens,
    which count against max_tokens.

    No seed: no neuron sampler applies one (check() refuses it where it would matter). No stop strings:
    the engine cuts them itself from the token ids, because vLLM's own check runs on text that starts
    empty after the prompt (vllm/v1/engine/detokenizer.py:92, 129-143) and would miss a stop string
    that spans a continuation's cut; the engine closes the request where its text stops.

    `usage`: ask for the final usage chunk, which carries prompt_tokens_details.cached_tokens when the
    server runs with prefix caching and --enable-prompt-tokens-details (launch.PREFIX_CACHING_SOURCES).
    """
    sp = request.sampling
    before = list(request.generated)
    body: dict[str, Any] = {
        "model": model_name,
        "prompt": [*request.prompt_token_ids, *before],
        "stream": True,
        "max_tokens": sp.max_tokens - len(before),
        "temperature": sp.temperature,
        "top_p": sp.top_p,
        "ignore_eos": sp.ignore_eos,
        # Each chunk's token ids (protocol.py:1107-1116; serving_completion.py:459-464): the text is cut
        # from them, never taken from vLLM's text.
        "return_token_ids": True,
    }
    if usage:
        body["stream_options"] = {"include_usage": True}
    if sp.n > 1:
        body["n"] = sp.n
    if sp.logprobs is not None:
        body["logprobs"] = sp.logprobs
        # Tokens as "token_id:N": the leader turns ids into text with the model's tokenizer, as vLLM does.
        body["return_tokens_as_token_ids"] = True
    if sp.presence_penalty:
        body["presence_penalty"] = sp.presence_penalty
    if sp.frequency_penalty:
        body["frequency_penalty"] = sp.frequency_penalty
    if sp.structured is not None:
        if sp.structured.kind == "json_object":
            body["response_format"] = {"type": "json_object"}
        else:
            # Always with a schema: 0.13.0 turns a json_schema without one into no constraint at all
            # (vllm@v0.13.0:vllm/entrypoints/openai/protocol.py:1223-1226 sets json=None, and
            # vllm/v1/structured_output/request.py:30-35 then builds no grammar); "{}" is any JSON.
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "response", "schema": json.loads(sp.structured.schema or "{}")},
            }
    return body


def _token_id(token: str) -> int:
    if not token.startswith("token_id:"):
        raise ValueError(f"expected a 'token_id:N' token from vLLM, got {token[:40]!r}")
    return int(token[len("token_id:") :])


def _logprobs(lp: dict[str, Any] | None, k: int) -> list[TokenLogprob]:
    """A completions-shaped logprobs block (tokens as "token_id:N") as one TokenLogprob per token."""
    if not lp:
        return []
    out = []
    for value, top in zip(lp.get("token_logprobs") or [], lp.get("top_logprobs") or []):
        # The map holds the top k plus the sampled token (k + 1 entries when it is not among them;
        # vllm@v0.13.0:vllm/entrypoints/openai/serving_completion.py:685-702).
        ranked = sorted(((_token_id(t), float(v)) for t, v in (top or {}).items()), key=lambda p: -p[1])[:k]
        out.append(TokenLogprob(logprob=float(value) if value is not None else float("-inf"), top=tuple(ranked)))
    return out


def chunk_events(chunk: dict[str, Any], logprobs_k: int | None) -> list[TokenEvent]:
    """One streamed chunk's choices as TokenEvents, one per token id, without text (the engine cuts it
    from the ids); vLLM's finish reason rides on each choice's last.

    vLLM 0.13.0 sends one choice per chunk, its index running over all n
    (vllm@v0.13.0:vllm/entrypoints/openai/serving_completion.py:377, 448-466); any number is read. Its
    text is left alone: the detokenizer holds back the end of it while a stop string may match and
    starts afresh after the prompt (vllm/v1/engine/detokenizer.py:84-92, 149-165), so it cannot be
    joined to the text of a stream another unit began.
    """
    events: list[TokenEvent] = []
    for choice in chunk.get("choices") or []:
        index = int(choice.get("index") or 0)
        finish = choice.get("finish_reason")
        ids = choice.get("token_ids")
        if ids is None:
            raise ValueError("a chunk without token_ids: the image's vLLM must honour return_token_ids (0.13.0 does)")
        lps = _logprobs(choice.get("logprobs"), logprobs_k) if logprobs_k is not None else []
        if not ids:
            # A final chunk may carry only the finish reason: token_id -1 marks it as no token
            # (the node's API does not count it in usage).
            if finish:
                events.append(TokenEvent(token_id=-1, text="", finish_reason=finish, index=index))
            continue
        last = len(ids) - 1
        for i, t in enumerate(ids):
            events.append(
                TokenEvent(
                    token_id=int(t),
                    text="",
                    finish_reason=finish if i == last else None,
                    index=index,
                    logprob=lps[i] if i < len(lps) else None,
                )
            )
    return events


def cached_tokens(chunk: dict[str, Any]) -> int | None:
    """The prompt tokens served from the prefix cache, from vLLM's final usage chunk (None: not this
    chunk). vLLM sets prompt_tokens_details only when some were cached
    (vllm@v0.13.0:vllm/entrypoints/openai/serving_completion.py:488-491): absent then means 0."""
    usage = chunk.get("usage")
    if not isinstance(usage, dict):
        return None
    details = usage.get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0
