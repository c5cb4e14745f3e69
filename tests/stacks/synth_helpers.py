"""Synthesize a flotilla deployment in-process for tests, the way app.py does.

Reusable by every stack test (Front, Observability...): `synthesize(config)` returns the built
stacks and their CloudFormation templates keyed by stack id ("Network", "Cell-0", ...).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import aws_cdk as cdk

from stacks.config import FlotillaConfig, load_config
from stacks.deployment import Deployment, build_deployment

REPO_ROOT = Path(__file__).resolve().parents[2]
CERTIFICATE_ARN = "arn:aws:acm:us-east-1:123456789012:certificate/11111111-2222-3333-4444-555555555555"

# The front door's two shapes, as config overrides of cdk.json: the deployment-wide checks
# (cfn-lint, cdk-nag, moto) run on each, since the certificate decides which listeners, security
# group rules and acknowledgements exist. "http-only" is cdk.json as shipped; "https" also sets an
# alarm e-mail, so the SNS e-mail subscription is checked too, and a prebuilt image, so the stacks
# without image assets (no ECR token grants) are checked too.
PREBUILT_IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/flotilla:1.0"
FRONT_DOORS: dict[str, dict] = {
    "http-only": {},
    # The public front door: internet-facing for the named clients, behind WAF, over HTTPS.
    "https": {
        "certificate_arn": CERTIFICATE_ARN,
        "alarm_email": "oncall@example.com",
        "image": PREBUILT_IMAGE,
        "front": {"scheme": "internet-facing", "client_cidrs": ["203.0.113.0/24"]},
    },
}


# Models for the tests about units of a given size: synth refuses a unit the model's shape cannot be split
# over (contract/layout.py). Llama-3.1-70B's 64 query heads split over 2 trn1.32xlarge (64 NeuronCores),
# Llama-3.1-405B's 128 over 4: the tests of multi-member units (leader and followers) use them.
LLAMA_70B = {"s3_uri": "s3://flotilla-models-example/llama-3.1-70b-instruct/", "name": "llama-3.1-70b-instruct"}
LLAMA_405B = {"s3_uri": "s3://flotilla-models-example/llama-3.1-405b-instruct/", "name": "llama-3.1-405b-instruct"}
# A made-up Llama shape whose heads, KV heads and MLP split over a unit of any size the quota tests use
# (tp_degree 32 x nodes, up to 64 x 32 = 2,048; 51,200 = 2^11 x 25 is a multiple of every one) and fit its
# memory, so those tests exercise the quota arithmetic they are about rather than the model.
ANY_UNIT_MODEL = {
    "name": "any-unit-test-model",
    "shape": {
        "num_hidden_layers": 1,
        "num_attention_heads": 51200,
        "num_key_value_heads": 51200,
        "hidden_size": 51200,
        "head_dim": 1,
        "intermediate_size": 51200,
        "vocab_size": 1024,
        "max_position_embeddings": 4096,
    },
}


def cdk_json_context() -> dict:
    """The context block of cdk.json: feature flags and the default `flotilla` config."""
    return json.loads((REPO_ROOT / "cdk.json").read_text())["context"]


def default_config() -> FlotillaConfig:
    return load_config(cdk_json_context()["flotilla"], None)


def config_with(**overrides) -> FlotillaConfig:
    """The cdk.json default with some keys replaced (nested sections merged)."""
    from stacks.config import _deep_merge, parse_config

    return parse_config(_deep_merge(cdk_json_context()["flotilla"], overrides))


@dataclass
class Synthesized:
    app: cdk.App
    deployment: Deployment
    assembly: cdk.cx_api.CloudAssembly
    templates: dict[str, dict]  # stack id -> template
    outdir: Path

    @property
    def stacks(self) -> list[cdk.Stack]:
        """Every stack of the app, each after the stacks it depends on (deploy order)."""
        by_id = {c.node.id: c for c in self.app.node.children if isinstance(c, cdk.Stack)}
        ordered: list[cdk.Stack] = []

        def visit(stack: cdk.Stack) -> None:
            if stack in ordered:
                return
            for dep in sorted(stack.dependencies, key=lambda d: d.node.id):
                visit(dep)
            ordered.append(stack)

        for stack_id in sorted(by_id):
            visit(by_id[stack_id])
        return ordered

    def template(self, stack_id: str) -> dict:
        return self.templates[stack_id]

    def resources(self, stack_id: str, type_: str | None = None) -> dict[str, dict]:
        res = self.templates[stack_id]["Resources"]
        return {k: v for k, v in res.items() if type_ is None or v["Type"] == type_}


def synthesize(config: FlotillaConfig, outdir: Path, *, plugins=()) -> Synthesized:
    """Build and synthesize every stack of `config` into outdir, with cdk.json's feature flags.

    plugins: CDK policy-validation plugins (e.g. cdk-nag's AwsSolutionsChecks) added to the app.
    """
    app = cdk.App(builtin_cloud_formation_validation=False, context=cdk_json_context(), outdir=str(outdir))
    deployment = build_deployment(app, config)
    if plugins:
        cdk.Validations.of(app).add_plugins(*plugins)
    assembly = app.synth()
    # Every stack in the app, so stacks added later to build_deployment are covered too.
    stacks = [c for c in app.node.children if isinstance(c, cdk.Stack)]
    templates = {s.node.id: assembly.get_stack_by_name(s.stack_name).template for s in stacks}
    return Synthesized(app=app, deployment=deployment, assembly=assembly, templates=templates, outdir=Path(outdir))


def run_app(config_yaml: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`python app.py` with `config_yaml` as the -c config file, as `make synth` runs it: Node 22 from
    node_modules, no end-of-life banner from jsii. For what synth prints and its exit status."""
    config = tmp_path / "config.yaml"
    config.write_text(config_yaml)
    env = {
        **os.environ,
        "CDK_CONTEXT_JSON": json.dumps({**cdk_json_context(), "config": str(config)}),
        "CDK_OUTDIR": str(tmp_path / "out"),
        "PATH": f"{REPO_ROOT / 'node_modules' / 'node' / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
    }
    return subprocess.run(
        [sys.executable, "app.py"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300
    )
