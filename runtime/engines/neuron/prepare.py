"""Get a node ready to start its Neuron rank: plan first, then fetch the model and compiled cache.

Order matters: the plan is validated from config.json alone (one small GET) before gigabytes of
weights move, so an impossible layout fails in seconds on every member, the same way.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import contract
from contract.llama import LlamaShape, ShapeError
from contract.ready import LoadPhase
from contract.speculation import ENV_SPECULATIVE_METHOD
from runtime.artifacts import CompileCache, Manifest, compile_cache_key, fetch, parse_s3_uri
from runtime.artifacts.fetch import ArtifactError, read_manifest
from runtime.engines.neuron.launch import NeuronOptions, RankPlan, plan_member
from runtime.engines.neuron.loading import LoadTracker
from runtime.membership import Membership

log = logging.getLogger("flotilla.neuron")
# A node's refusal names the environment variables the stacks set it from (contract/layout.py Names).
NODE_NAMES = {
    "instance_type": contract.ENV_INSTANCE_TYPE,
    "nodes": contract.ENV_NODES_PER_UNIT,
    "seq_len": contract.ENV_NEURON_SEQ_LEN,
    "batch_size": contract.ENV_NEURON_BATCH_SIZE,
    "cp_degree": contract.ENV_NEURON_CP_DEGREE,
    "attention_dp_degree": contract.ENV_NEURON_ATTENTION_DP_DEGREE,
    "prefix_caching_block": contract.ENV_NEURON_PREFIX_CACHING_BLOCK,
    "speculation": ENV_SPECULATIVE_METHOD,
}


@dataclass(frozen=True)
class PreparedRank:
    plan: RankPlan
    model_manifest: Manifest
    compile_key: str
    compile_cache_hit: bool  # False: the engine compiles on start; call store_compiled after


def prepare_rank(
    membership: Membership,
    *,
    model_uri: str,
    model_dir: str | Path,
    instance_type: str,
    options: NeuronOptions,
    s3,
    compile_cache_uri: str | None = None,
    neuron_sdk_version: str | None = None,
    tracker: LoadTracker | None = None,
) -> PreparedRank:
    tracker = tracker or LoadTracker()
    sdk = neuron_sdk_version or os.environ.get(contract.ENV_NEURON_SDK_VERSION, "")
    manifest = read_manifest(model_uri, s3=s3)
    if "config.json" not in {f.path for f in manifest.files}:
        raise ArtifactError(
            f"{model_uri}: the published model has no config.json; publish the whole Hugging Face checkpoint directory"
        )
    draft = options.speculation.draft_dir
    if draft and f"{draft}/config.json" not in {f.path for f in manifest.files}:
        raise ValueError(
            f"{model_uri}: speculation's draft {draft!r} is not in the published model's manifest (no "
            f"{draft}/config.json); put the EAGLE draft checkpoint in the model directory's {draft}/ and publish "
            "the directory again, so the model's manifest lists and verifies the draft with it"
        )
    shape = _published_shape(model_uri, "config.json", s3)
    plan = plan_member(
        membership,
        instance_type=instance_type,
        model=shape,
        model_dir=str(model_dir),
        options=options,
        model_name=model_uri,
        names=NODE_NAMES,
        # the EAGLE draft's own shape, so the memory check counts what the node will load
        draft=_published_shape(model_uri, f"{draft}/config.json", s3) if draft else None,
    )
    tracker.phase(LoadPhase.FETCH_MODEL, total_bytes=manifest.total_bytes)
    manifest = fetch(model_uri, model_dir, s3=s3, manifest=manifest, on_bytes=tracker.bytes)
    key = compile_cache_key(model_digest=manifest.digest, nxdi_config=plan.nxdi_config, neuron_sdk_version=sdk)
    hit = False
    if compile_cache_uri:
        tracker.phase(LoadPhase.FETCH_COMPILED)
        hit = CompileCache(uri=compile_cache_uri, s3=s3).fetch(
            key, options.compiled_artifacts_dir, on_bytes=tracker.bytes
        )
    return PreparedRank(plan=plan, model_manifest=manifest, compile_key=key, compile_cache_hit=hit)


def _published_shape(model_uri: str, path: str, s3) -> LlamaShape:
    """The shape in the published model's `path` (its config.json, or its EAGLE draft's)."""
    bucket, prefix = parse_s3_uri(model_uri)
    source = f"{model_uri.rstrip('/')}/{path}"
    try:
        raw = json.loads(s3.get_object(Bucket=bucket, Key=prefix + path)["Body"].read())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ShapeError(f"{source}: not valid JSON ({exc}); republish the checkpoint") from None
    return LlamaShape.from_config(raw, source=source)


def store_compiled(prepared: PreparedRank, *, compile_cache_uri: str, compiled_dir: str | Path, s3) -> bool:
    """After the engine is ready: upload what it compiled, unless it came from the cache."""
    if prepared.compile_cache_hit:
        return False
    CompileCache(uri=compile_cache_uri, s3=s3).store(prepared.compile_key, compiled_dir)
    return True


def launch_spec(plan: RankPlan, base_env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """argv and environment for this rank's engine process: the plan's variables win over
    whatever the container inherited, so a stray NEURON_RANK_ID cannot mis-wire a unit."""
    return list(plan.command), {**base_env, **plan.env}
