"""What the neuron engine forwards to the vLLM server in its image, and what it refuses first.

The leader validates every field against OpenAI's schema; this module decides which of them the
pinned vLLM can actually honour in the unit's mode, builds the /v1/completions body for the V1
plugin's OpenAI server, and turns its streamed chunks back into TokenEvents.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from runtime.engines.base import GenerationRequest, RequestRejected, SamplingParams, TokenEvent, TokenLogprob

# vLLM 0.16.0's /v1/completions request schema (vllm==0.16.0:
# vllm/entrypoints/openai/completion/protocol.py): frequency_penalty :49, logprobs :51, max_tokens :52,
# n :53, presence_penalty :54, seed :55, stop :56, response_format :92 (json_object / json_schema
# become structured outputs, :259-290), return_tokens_as_token_ids :134, return_token_ids :142.
# Its default max_logprobs is 20 (vllm/config/model.py:201).
VLLM_MAX_LOGPROBS = 20


@dataclass(frozen=True)
class Serves:
    """The fields the unit's vLLM honours, and how to name the mode in a refusal."""

    mode: str
    n: bool
    logprobs: bool
    structured: bool
    seed: bool
    penalties: bool
    fix: str  # what the operator can change to get the refused fields


def serves(*, multi_node: bool, sampling: str) -> Serves:
    if multi_node:
        # The multi-node units run AWS's V0 fork (branch neuron-2.24-vllm-v0.7.2), whose leader serves
        # only the demo /generate endpoint with raw SamplingParams, not the OpenAI server
        # (aws-neuron/upstreaming-to-vllm@490ab20f: examples/neuron/multi_node/launch_script.py:116-129,
        # vllm/entrypoints/api_server.py:35-58). Its on-device sampling applies only top_k, top_p and
        # temperature (vllm/worker/neuron_model_runner.py:137-146) and reports the token id in place
        # of each logprob (vllm/model_executor/model_loader/neuronx_distributed.py:187-208). So the
        # leader sends one plain sequence per request and refuses the rest.
        return Serves(
            mode="a multi-node neuron unit (vLLM V0 fork, /generate)",
            n=False,
            logprobs=False,
            structured=False,
            seed=False,
            penalties=False,
            fix="send it to a single-node unit",
        )
    if sampling == "cpu":
        # vLLM's own sampler on the host: logprobs, the structured-output bitmask, seeds and penalties
        # all apply (vllm-project/vllm-neuron 0.5.0: vllm_neuron/worker/neuronx_distributed_model_runner.py:
        # 229-260 bitmask on the CPU path, :876-885 logprobs).
        return Serves("cpu sampling", n=True, logprobs=True, structured=True, seed=True, penalties=True, fix="")
    # On-device sampling (the plugin's default, loader :1071-1073, :1104) passes only top_k, top_p and
    # temperature to the device (runner :1715-1745), returns no logprobs (loader :542-550) and drops
    # the grammar bitmask with a warning (runner :229-260). vLLM itself fans n out into child requests
    # before sampling (vllm==0.16.0: vllm/v1/engine/parallel_sampling.py), so n still works.
    return Serves(
        mode="this unit's on-device sampling",
        n=True,
        logprobs=False,
        structured=False,
        seed=False,
        penalties=False,
        fix="set FLOTILLA_NEURON_SAMPLING=cpu on the unit",
    )


def check(sp: SamplingParams, s: Serves) -> None:
    """Refuse what the unit's vLLM would silently ignore: one line naming the field and the fix."""

    def refuse(field: str, what: str) -> RequestRejected:
        fix = f"; {s.fix}" if s.fix else ""
        return RequestRejected(f"'{field}' is not served by {s.mode}: {what}{fix}", param=field)

    if sp.n > 1 and not s.n:
        raise refuse("n", "leave it out or set it to 1, and send one request per completion")
    if sp.n > 1 and sp.temperature < 1e-5:
        # vLLM treats temperature below 1e-5 as greedy and refuses n > 1 there
        # (vllm==0.16.0: vllm/sampling_params.py:367-372, 479-481).
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
    if sp.seed is not None and sp.temperature > 0 and not s.seed:
        raise refuse("seed", "it does not seed its sampler; leave 'seed' out or use temperature 0")
    if (sp.presence_penalty or sp.frequency_penalty) and not s.penalties:
        field = "presence_penalty" if sp.presence_penalty else "frequency_penalty"
        raise refuse(field, "it does not apply penalties; leave it out or set it to 0")


def completions_body(request: GenerationRequest, model_name: str) -> dict[str, Any]:
    """The streamed /v1/completions request for vLLM 0.16.0's OpenAI server (prompt as token ids)."""
    sp = request.sampling
    body: dict[str, Any] = {
        "model": model_name,
        "prompt": list(request.prompt_token_ids),
        "stream": True,
        "max_tokens": sp.max_tokens,
        "temperature": sp.temperature,
        "top_p": sp.top_p,
        "ignore_eos": sp.ignore_eos,
        "return_token_ids": True,
    }
    if sp.stop:
        body["stop"] = list(sp.stop)
    if sp.seed is not None:
        body["seed"] = sp.seed
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
        # The map holds the top k plus the sampled token (k + 1 entries when it is not among them).
        ranked = sorted(((_token_id(t), float(v)) for t, v in (top or {}).items()), key=lambda p: -p[1])[:k]
        out.append(TokenLogprob(logprob=float(value) if value is not None else float("-inf"), top=tuple(ranked)))
    return out


def chunk_events(chunk: dict[str, Any], tokenizer: Any, logprobs_k: int | None) -> list[TokenEvent]:
    """One streamed chunk's choices as TokenEvents, one per token; the text rides on each choice's last."""
    events: list[TokenEvent] = []
    for choice in chunk.get("choices") or []:
        index = int(choice.get("index") or 0)
        text = choice.get("text") or ""
        finish = choice.get("finish_reason")
        ids = choice.get("token_ids")
        if ids is None:
            # A vLLM without return_token_ids: recover ids from the text (may merge tokens).
            ids = tokenizer.encode(text) if text else []
        lps = _logprobs(choice.get("logprobs"), logprobs_k) if logprobs_k is not None else []
        if not ids:
            # A final chunk may carry only the finish reason: token_id -1 marks it as no token
            # (the node's API does not count it in usage).
            if finish or text:
                events.append(TokenEvent(token_id=-1, text=text, finish_reason=finish, index=index))
            continue
        last = len(ids) - 1
        for i, t in enumerate(ids):
            events.append(
                TokenEvent(
                    token_id=int(t),
                    text=text if i == last else "",
                    finish_reason=finish if i == last else None,
                    index=index,
                    logprob=lps[i] if i < len(lps) else None,
                )
            )
    return events
