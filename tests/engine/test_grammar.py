"""The grammar's token mask (runtime/engines/grammar.py): the same bits llguidance's own torch helper
computes, without importing that helper, whose torch.compile decorator loads torch._dynamo."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# In a fresh interpreter, so what the mask imports is what an engine process's first structured request
# imports. Then llguidance's helper (imported last, on purpose) fills a mask at every step of a document,
# and the two must agree bit for bit.
SCRIPT = """
import json, sys
import torch
from runtime.engines.base import StructuredOutput
from runtime.engines.grammar import Grammars
from runtime.models import resolve_model

tiny = resolve_model("tiny")
tok, vocab = tiny.make_tokenizer(), tiny.shape.vocab_size
grammars = Grammars(tok, vocab)
spec = StructuredOutput(kind="json_schema", schema={"type": "object", "properties": {"n": {"type": "integer"}},
                                                    "required": ["n"]})
ours = grammars.matcher(grammars.grammar(spec))
masks = []
for ch in '{"n":42}':
    allowed = ours.allowed()
    masks.append(allowed.tolist())
    ours.consume(ch.encode()[0])
loaded = sorted(m for m in ("torch._dynamo", "llguidance.torch") if m in sys.modules)

from llguidance.torch import fill_next_token_bitmask
theirs = grammars.matcher(grammars.grammar(spec))
same = []
for ch, mask in zip('{"n":42}', masks):
    bits = torch.zeros(1, (vocab + 31) // 32, dtype=torch.int32)
    fill_next_token_bitmask(theirs._m, bits, 0)
    expect = ((bits[0].unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1).view(-1)[:vocab].bool().tolist()
    same.append(expect == mask)
    theirs.consume(ch.encode()[0])
print(json.dumps({"loaded": loaded, "same": same, "allowed": [sum(m) for m in masks]}))
"""


def test_the_mask_equals_llguidances_own_and_loads_neither_its_torch_helper_nor_dynamo():
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["loaded"] == [], got["loaded"]
    assert got["same"] == [True] * 8, got
    # The masks say something: one byte allowed at '{' (compact JSON), more than one inside the number.
    assert got["allowed"][0] == 1 and max(got["allowed"]) > 1, got["allowed"]
