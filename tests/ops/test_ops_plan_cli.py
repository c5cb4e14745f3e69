"""`flotilla plan` on the command line: tables, the config it writes, JSON, and exit status 2 with
a one-line error for impossible inputs."""

from __future__ import annotations

import json

import yaml

LLAMA_70B = [
    "--layers",
    "80",
    "--hidden",
    "8192",
    "--heads",
    "64",
    "--kv-heads",
    "8",
    "--intermediate",
    "28672",
    "--vocab",
    "128256",
    "--context-length",
    "8192",
]
TRAFFIC = ["--rps", "10", "--prompt-tokens", "1000", "--output-tokens", "200", "--batch-size", "8"]


def test_plan_prints_the_unit_the_memory_the_bounds_and_writes_the_config(run_cli, tmp_path):
    out_path = tmp_path / "flotilla.yaml"
    code, out = run_cli(
        "plan",
        *LLAMA_70B,
        *TRAFFIC,
        "--availability-zones",
        "us-east-1a,us-east-1b",
        "--name",
        "llama-3.1-70b-instruct",
        "--model-uri",
        "s3://my-models/llama-3.1-70b-instruct/",
        "--write",
        str(out_path),
    )
    assert code == 0, out
    assert "nodes per unit" in out and "Memory per NeuronCore" in out and "decode step" in out
    assert "4.34 GiB" in out  # 4,661,264,896 B of weights per core (see test_ops_capacity)
    cfg = yaml.safe_load(out_path.read_text())
    assert cfg == {
        "instance_type": "trn1.32xlarge",
        "nodes_per_unit": 1,
        "units": 4,
        # no units_per_cell: the config's default (20), as it is fixed once deployed
        "availability_zones": ["us-east-1a", "us-east-1b"],
        # from the simulated rollout: 4 units roll one at a time (10 %, at least 1)
        # the sequence (1,000 + 200 tokens) and batch the memory was sized at, which synth checks again
        "node": {"neuron_seq_len": 1200, "neuron_batch_size": 8},
        "unit_rollout": "surge",
        "units_per_wave": 1,
        # The shape synth checks the units' layout against: the flags' (8,192 positions, not the
        # llama-3.1-70b preset's 131,072), as config.json fields.
        "model": {
            "s3_uri": "s3://my-models/llama-3.1-70b-instruct/",
            "name": "llama-3.1-70b-instruct",
            "shape": {
                "num_hidden_layers": 80,
                "num_attention_heads": 64,
                "hidden_size": 8192,
                "intermediate_size": 28672,
                "vocab_size": 128256,
                "max_position_embeddings": 8192,
                "num_key_value_heads": 8,
                "head_dim": 128,
                "tie_word_embeddings": False,
                "dtype": "bfloat16",
            },
        },
    }
    assert out_path.read_text().startswith("# flotilla config from `flotilla plan`")
    assert "Rollout (simulated" in out and "units_per_wave 1 (*)" in out
    # The unit's image and why: one node, the V1 plugin image (contract/neuron.py).
    assert "single-node units: with node.engine neuron the image is built from runtime/Dockerfile.neuron" in (
        out_path.read_text()
    )
    assert "1 (single-node)" in out and "fits one trn1.32xlarge" in " ".join(out.split())


def test_plan_recommends_a_wave_from_the_simulated_rollout(run_cli):
    code, out = run_cli("plan", *LLAMA_70B, "--rps", "400", *TRAFFIC[2:], "--load-minutes", "30", "--json")
    assert code == 0
    doc = json.loads(out)
    units = doc["units"]
    rollout = doc["rollout"]
    assert units >= 100
    # surge keeps every unit in rotation: the default wave (10 %) sheds nothing
    assert rollout["units_per_wave"] == doc["config"]["units_per_wave"] == -(-units // 10)
    simulated = {s["units_per_wave"]: s for s in rollout["simulated"]}
    assert simulated[1]["duration_s"] > 5 * simulated[rollout["units_per_wave"]]["duration_s"]


def test_plan_with_replace_and_no_headroom_says_to_add_units(run_cli):
    code, out = run_cli("plan", *LLAMA_70B, *TRAFFIC, "--rollout", "replace")
    assert code == 0
    assert "add units" in out


def test_plan_json_carries_every_figure(run_cli):
    code, out = run_cli("plan", *LLAMA_70B, *TRAFFIC, "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["tp_degree"] == 32 and doc["units"] == 4
    assert doc["memory_per_core_bytes"]["weights"] == 4_661_264_896
    assert doc["config"]["nodes_per_unit"] == 1
    assert doc["mode"] == "single-node" and doc["image"]["dockerfile"] == "runtime/Dockerfile.neuron"
    assert doc["image"]["server"] == "vllm.entrypoints.openai.api_server"
    assert doc["why"].startswith("fits one trn1.32xlarge")


def test_plan_from_a_config_json(run_cli, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            {
                "num_hidden_layers": 80,
                "hidden_size": 8192,
                "num_attention_heads": 64,
                "num_key_value_heads": 8,
                "intermediate_size": 28672,
                "vocab_size": 128256,
                "max_position_embeddings": 8192,
                "torch_dtype": "bfloat16",
            }
        )
    )
    code, out = run_cli("plan", "--config-json", str(path), *TRAFFIC, "--json")
    assert code == 0
    assert json.loads(out)["units"] == 4


def test_plan_without_a_model_exits_two_naming_the_missing_flags(run_cli):
    code, out = run_cli("plan", *TRAFFIC)
    assert code == 2
    flags = "--layers, --hidden, --heads, --context-length"
    assert " ".join(out.split()) == (
        f"error: --config-json is not given and neither are {flags}: "
        f"describe the model with --config-json PATH, --preset NAME or {flags}"
    )


def test_plan_for_a_model_no_unit_can_hold_exits_two(run_cli):
    code, out = run_cli(
        "plan",
        "--params",
        "20e12",
        "--intermediate",
        "131072",
        "--vocab",
        "128256",
        "--layers",
        "200",
        "--hidden",
        "32768",
        "--heads",
        "256",
        "--kv-heads",
        "16",
        "--context-length",
        "8192",
        *TRAFFIC,
    )
    assert code == 2
    assert "--max-nodes=8 fits no unit of" in out and "on 1..8 trn1.32xlarge nodes" in out


def test_plan_rejects_bad_availability_zone_lists(run_cli):
    code, out = run_cli("plan", *LLAMA_70B, *TRAFFIC, "--availability-zones", "us-east-1a")
    assert code == 2 and "--availability-zones=us-east-1a names 1 AZ(s): give 2 to 6 AZs (or none)" in out


def test_plan_refuses_a_negative_rollout_figure_naming_the_flag(run_cli):
    code, out = run_cli("plan", *LLAMA_70B, *TRAFFIC, "--spare-nodes", "-1")
    assert code == 2 and "--spare-nodes=-1 is out of range: give an integer of at least 0" in " ".join(out.split())


def test_the_written_config_is_accepted_by_the_cdk_apps_config_loader(run_cli, tmp_path):
    """The YAML `plan --write` produces is what `cdk synth -c config=...` reads (stacks/config.py)."""
    from stacks import config  # noqa: PLC0415 - the CDK app's loader, imported only where it is read

    out_path = tmp_path / "flotilla.yaml"
    code, _ = run_cli(
        "plan",
        *LLAMA_70B,
        "--rps",
        "100",
        "--prompt-tokens",
        "1000",
        "--output-tokens",
        "200",
        "--batch",
        "8",
        "--availability-zones",
        "us-east-1a,us-east-1b",
        "--model-uri",
        "s3://my-models/llama-3.1-70b-instruct/",
        "--write",
        str(out_path),
    )
    assert code == 0
    cfg = config.load_config(None, str(out_path))
    # 70B at batch 8: 3.0158 req/s per unit -> 100 / 3.0158 = 33.2 -> 34 units over 2 cells of 20
    assert (cfg.instance_type, cfg.nodes_per_unit, cfg.units, cfg.cells) == ("trn1.32xlarge", 1, 34, 2)
    assert cfg.availability_zones == ("us-east-1a", "us-east-1b")


LLAMA_405B = [
    "--layers",
    "126",
    "--hidden",
    "16384",
    "--heads",
    "128",
    "--kv-heads",
    "8",
    "--intermediate",
    "53248",
    "--vocab",
    "128256",
    "--context-length",
    "131072",
]


def test_plan_json_says_a_multi_node_neuron_unit_runs_both_phases_tensor_parallel_over_the_unit(run_cli):
    # What runtime/engines/neuron/launch.py configures across nodes: NxD Inference's multi-node layout
    # (examples/multi_node.md: one tp_degree over every node's NeuronCores), no pipeline stages.
    code, out = run_cli("plan", *LLAMA_405B, *TRAFFIC, "--json")
    assert code == 0, out
    doc = json.loads(out)
    nodes, tp = doc["nodes_per_unit"], doc["tp_degree"]
    assert nodes > 1 and tp == 32 * nodes
    assert doc["neuron_layout"].startswith(
        f"prefill (context encoding) and decode (token generation) both tensor parallel, tp_degree={tp}, "
        "cp_degree=1, attention_dp_degree=1"
    )


def test_plan_write_needs_the_model_uri_and_writes_units_per_cell_only_when_asked(run_cli, tmp_path):
    out_path = tmp_path / "flotilla.yaml"
    code, out = run_cli("plan", *LLAMA_70B, *TRAFFIC, "--write", str(out_path))
    assert code == 2 and "--model-uri is needed with --write" in " ".join(out.split())
    assert not out_path.exists()
    uri = ["--model-uri", "s3://my-models/llama-3.1-70b/"]
    code, out = run_cli("plan", *LLAMA_70B, *TRAFFIC, *uri, "--units-per-cell", "10", "--write", str(out_path))
    assert code == 0, out
    assert yaml.safe_load(out_path.read_text())["units_per_cell"] == 10


def test_plan_write_names_a_known_models_shape_by_its_preset(run_cli, tmp_path):
    out_path = tmp_path / "flotilla.yaml"
    uri = ["--model-uri", "s3://my-models/llama-3.1-405b-instruct/"]
    code, out = run_cli("plan", "--preset", "llama-3.1-405b", *TRAFFIC, *uri, "--write", str(out_path))
    assert code == 0, out
    written = yaml.safe_load(out_path.read_text())
    # 2 nodes hold 405B at 8 sequences of 1,200 tokens: the config carries that sequence, so synth agrees.
    assert written["model"]["shape"] == "llama-3.1-405b" and written["nodes_per_unit"] == 2
    assert written["node"] == {"neuron_seq_len": 1200, "neuron_batch_size": 8}


def test_plan_write_refuses_a_config_the_cdk_app_would_refuse(run_cli, tmp_path):
    out_path = tmp_path / "flotilla.yaml"
    uri = ["--model-uri", "s3://my-models/llama-3.1-70b/"]
    code, out = run_cli("plan", *LLAMA_70B, *TRAFFIC, *uri, "--name", "llama 70b", "--write", str(out_path))
    flat = " ".join(out.split())
    assert code == 2 and "would write a config `cdk synth` refuses (model.name='llama 70b'" in flat
    assert not out_path.exists()
