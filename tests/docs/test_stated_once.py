"""A value several components set differently is stated in one place and linked from the rest: the
drain timeout is the node's default, the Cell stacks' node.drain_timeout_s and the Router stack's own
(docs/node.md, Group semantics, "Drain"); a second statement of its seconds drifts (it once had four
values in four places)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# setting -> the one doc that states its values
STATED_IN = {"FLOTILLA_DRAIN_TIMEOUT_S": "docs/node.md"}
SECONDS = re.compile(r"\b\d+(\.\d+)? ?s\b")


def statements(text: str, setting: str) -> list[int]:
    """Lines where the setting is followed, within the same clause, by a number of seconds."""
    found = []
    for m in re.finditer(re.escape(setting), text):
        clause = re.split(r"[;.)|]\s", text[m.end() : m.end() + 60])[0]
        if SECONDS.search(clause):
            found.append(text.count("\n", 0, m.start()) + 1)
    return found


def test_the_drain_timeout_is_stated_in_one_doc_and_linked_from_the_others():
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for setting, home in STATED_IN.items():
        elsewhere = [
            f"{p.relative_to(ROOT)}:{n}"
            for p in docs
            if p.relative_to(ROOT).as_posix() != home
            for n in statements(p.read_text(), setting)
        ]
        assert not elsewhere, f"{setting}'s seconds belong in {home} only; link there from:\n" + "\n".join(elsewhere)
        assert statements((ROOT / home).read_text(), setting), f"{home} no longer states {setting}"


def test_a_stated_value_is_found_and_a_link_is_not():
    assert statements("finish (up to `FLOTILLA_DRAIN_TIMEOUT_S`, 120 s), exit 0", "FLOTILLA_DRAIN_TIMEOUT_S") == [1]
    linked = "within `--drain-timeout` (`FLOTILLA_DRAIN_TIMEOUT_S`, set by the Router stack: [Drain](node.md)), exit 0"
    assert statements(linked, "FLOTILLA_DRAIN_TIMEOUT_S") == []
