"""`make synth`'s path end to end: the pinned CDK CLI runs app.py offline, and the image asset
it stages holds only what the image needs."""

from __future__ import annotations

import json
import os
import subprocess

import yaml
from synth_helpers import REPO_ROOT


def _cdk_synth(tmp_path, *args: str) -> subprocess.CompletedProcess:
    """The pinned CDK CLI's `synth` (as `make synth` runs it), offline, into tmp_path/cdk.out."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        {
            "PATH": f"{REPO_ROOT / 'node_modules' / 'node' / 'bin'}{os.pathsep}{env['PATH']}",
            "CDK_HOME": str(tmp_path / "cdk-home"),
            "CDK_DISABLE_CLI_TELEMETRY": "true",
            "npm_config_update_notifier": "false",
            # Any attempt to reach the network (notices, telemetry, lookups) hits a dead proxy.
            "HTTPS_PROXY": "http://127.0.0.1:9",
            "HTTP_PROXY": "http://127.0.0.1:9",
            "AWS_EC2_METADATA_DISABLED": "true",
        }
    )
    return subprocess.run(
        [str(REPO_ROOT / "node_modules" / ".bin" / "cdk"), "synth", "--quiet", "-o", str(tmp_path / "cdk.out"), *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_cdk_cli_synthesizes_the_default_deployment_offline(tmp_path):
    proc = _cdk_synth(tmp_path)
    out = tmp_path / "cdk.out"
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    stacks = {
        a["displayName"]: a["properties"]["stackName"]
        for a in manifest["artifacts"].values()
        if a["type"] == "aws:cloudformation:stack"
    }
    assert stacks == {
        name: f"flotilla-{name}" for name in ("Network", "Discovery", "Cell-0", "Front", "Observability", "Router")
    }
    assert "NOTICES" not in proc.stdout + proc.stderr
    # Environment-agnostic: no account or region was looked up.
    assert all(
        a.get("environment", "aws://unknown-account/unknown-region") == "aws://unknown-account/unknown-region"
        for a in manifest["artifacts"].values()
        if a["type"] == "aws:cloudformation:stack"
    )


def test_cdk_synth_refuses_llama_8b_on_two_trn1_nodes_in_one_line_naming_the_layout_that_serves(tmp_path):
    # The node would refuse this unit at start (contract/layout.py): 2 x 32 NeuronCores = tp_degree 64 does
    # not split Llama-3.1-8B's 32 query heads. Synth runs the node's check and refuses it before any stack.
    config = tmp_path / "eight-b-on-two-nodes.yaml"
    config.write_text("nodes_per_unit: 2\nmodel:\n  name: llama-3.1-8b-instruct\n")
    proc = _cdk_synth(tmp_path, "-c", f"config={config}")
    assert proc.returncode != 0 and not (tmp_path / "cdk.out" / "manifest.json").exists()
    ours = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert ours == [
        "error: nodes_per_unit=2 cannot serve llama-3.1-8b-instruct on trn1.32xlarge: tp_degree=64 (2 x 32 "
        "NeuronCores) does not split num_attention_heads=32 (num_key_value_heads=8, intermediate_size=14336) "
        "evenly: use nodes_per_unit 1"
    ], proc.stderr


def test_cdk_json_turns_off_notices_telemetry_and_version_reporting():
    cdk_json = json.loads((REPO_ROOT / "cdk.json").read_text())
    assert cdk_json["notices"] is False
    assert cdk_json["versionReporting"] is False
    assert cdk_json["context"]["cli-telemetry"] is False


def test_image_assets_stage_only_runtime_contract_and_the_lock_file(default_synth):
    # Two images: the CPU runtime image (router) and the single-node Neuron image (the default unit
    # is one node on the neuron engine).
    assets = [p for p in default_synth.outdir.iterdir() if p.name.startswith("asset.")]
    assert len(assets) == 2
    for asset in assets:
        # (CDK always stages the .dockerignore itself, so `docker build` applies the same rules.)
        assert sorted(p.name for p in asset.iterdir()) == [".dockerignore", "constraints.txt", "contract", "runtime"]
        staged = [p.relative_to(asset).as_posix() for p in asset.rglob("*")]
        assert {"runtime/Dockerfile", "runtime/Dockerfile.neuron", "runtime/Dockerfile.neuron-multinode"} <= set(staged)
        assert not [p for p in staged if "__pycache__" in p or p.endswith(".pyc")]


def test_ci_workflow_runs_make_lint_make_test_then_make_synth_and_uploads_cdk_out():
    workflow = yaml.safe_load((REPO_ROOT / ".github" / "workflows" / "ci.yml").read_text())
    (job,) = workflow["jobs"].values()
    runs = [s.get("run") for s in job["steps"] if "run" in s]
    assert runs == ["make lint", "make test", "make synth"]
    upload = job["steps"][-1]
    assert upload["uses"].startswith("actions/upload-artifact@")
    assert upload["with"]["path"] == "cdk.out/"
