"""Engine and strategy names are contract.Engine and contract.Strategy: a comparison with a bare
string would keep passing after a name changed, where an enum member fails at import."""

from __future__ import annotations

import json
import re
from pathlib import Path

import contract
from contract import Engine, Strategy

ROOT = Path(__file__).resolve().parents[2]
NAMES = "|".join(sorted({*contract.ENGINES, *contract.STRATEGIES}))
# `== "neuron"`, `!= "tensor"`, `uses("pipeline")`, `in ("echo", ...)`: a name compared or asked for.
BARE = re.compile(rf'(?:[=!]=\s*|uses\(|in \()"(?:{NAMES})"')
CHECKED = ("runtime", "contract", "ops", "stacks")


def test_no_product_module_compares_a_bare_engine_or_strategy_name():
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for top in CHECKED
        for path in sorted((ROOT / top).rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if BARE.search(line.split("  # ")[0])
    ]
    assert not found, "compare with contract.Engine / contract.Strategy members:\n" + "\n".join(found)


def test_the_enums_are_the_names_flags_and_json_carry():
    assert contract.ENGINES == ("reference", "echo", "neuron")
    assert contract.STRATEGIES == ("pipeline", "tensor")
    assert Engine("neuron") is Engine.NEURON and Strategy("tensor") is Strategy.TENSOR
    assert json.loads(json.dumps({"engine": Engine.ECHO})) == {"engine": "echo"}
    assert f"{Strategy.PIPELINE}" == "pipeline"
