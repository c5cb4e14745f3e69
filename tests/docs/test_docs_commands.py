"""Every command line in README.md and docs/ (code blocks and inline code) is one the tools accept: each
`flotilla`, `flotilla-node`, `python -m runtime ...`, `python -m ops ...` and benchmark line parses with
the program's own argparse parser, each `make` line names Makefile targets and variables (and its
*_ARGS parse with the module the target runs), each CDK line is the pinned CLI's command with its
options, each `aws` line an operation with its members (botocore). A flag cited alone must be an option
of one of those, or one the project passes to an outside program (vLLM, NxD Inference, the EFA
installer). What is valid always comes from those definitions (tests/doccheck.py), never from a list
here, so commands and flags keep working as they land and a renamed one fails at once."""

from __future__ import annotations

import argparse
import re
from functools import cache

import doccheck
import pytest
from doccheck import ROOT, Command

DOCS = [p.relative_to(ROOT).as_posix() for p in doccheck.doc_files()]
# Flags of outside programs the docs explain and the project never runs, each with where it is defined.
OUTSIDE_FLAGS = {
    "--ipc": "docker run --ipc=host (Docker docs, `docker run` reference, IPC settings)",
}
# aws flags cited alone, each with an invocation that botocore checks (so a wrong one still fails).
AWS_FLAGS = {
    "--resources-to-skip": ["cloudformation", "continue-update-rollback", "--stack-name", "s", "--resources-to-skip"],
}


def problems_of(command: Command) -> list[str]:
    naming = not command.span.fenced  # inline code may name a command without every argument
    if command.tool in doccheck.console_scripts():
        return doccheck.parse_problems(doccheck.console_scripts()[command.tool], list(command.argv), naming=naming)
    if command.tool == "python":
        entry = doccheck.python_entry(command.argv)
        return doccheck.parse_problems(entry[0], entry[1], naming=naming) if entry else []
    if command.tool == "make":
        return doccheck.make_problems(command.argv, environment=frozenset(contract_environment()))
    if command.tool == "cdk":
        return doccheck.cdk_problems(list(command.argv), doccheck.stack_ids(), naming=naming)
    if command.tool == "aws":
        return doccheck.aws_problems(list(command.argv), naming=naming)
    raise AssertionError(command.tool)


@cache
def contract_environment() -> set[str]:
    """Environment variables the runtime reads (contract.ENV_*): `make local PORT=9000` sets one."""
    import contract

    return {v for k, v in vars(contract).items() if k.startswith("ENV_") and isinstance(v, str)}


@pytest.mark.parametrize("doc", DOCS)
def test_every_command_line_of_the_doc_is_one_its_tool_accepts(doc):
    commands = [c for c in doccheck.all_commands() if c.span.path == ROOT / doc]
    problems = [f"{c.span.where()}: `{c.line()}`: {p}" for c in commands for p in problems_of(c)]
    assert not problems, "\n".join(problems)


def test_the_cdk_cli_is_called_one_way_the_pinned_one_the_makefile_runs():
    """`cdk` on its own is a global install nobody made; `npx cdk` a second spelling of the same binary."""
    assert f"CDK    := {doccheck.CDK_BINARY}" in doccheck.MAKEFILE.read_text()
    others = [
        f"{c.span.where()}: `{c.line()}`"
        for c in doccheck.all_commands()
        if c.tool == "cdk" and c.how not in (doccheck.CDK_BINARY, f"./{doccheck.CDK_BINARY}")
    ]
    assert not others, f"call {doccheck.CDK_BINARY} (or a make target):\n" + "\n".join(others)


def _options(parser: argparse.ArgumentParser, found: set[str]) -> set[str]:
    for action in parser._actions:
        found.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _options(sub, found)
    return found


@cache
def known_flags() -> frozenset[str]:
    """Every option of the project's commands, the CDK CLI's, and every flag the project's code passes
    to an outside program (a string literal in runtime/, stacks/, ops/, a RUN line of a Dockerfile)."""
    found: set[str] = set()
    entries = [*doccheck.console_scripts().values(), "runtime", "runtime.local"]
    entries += sorted(
        {m for t in doccheck.make_targets() for m in re.findall(r"\$\(PY\) -m ([\w.]+)", " ".join(doccheck.recipe(t)))}
    )
    for entry in entries:
        parser = doccheck.cli_parser(entry)
        if parser is not None:
            _options(parser, found)
    found |= doccheck.cdk_option_names()
    for literal in doccheck.python_strings("runtime", "stacks", "ops", scripts_only=True):
        found.update(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", literal))
    for path in ROOT.glob("runtime/Dockerfile*"):
        if path.suffix != ".dockerignore":
            found.update(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", path.read_text()))
    return frozenset(found)


def cited_flags() -> list[tuple[str, str]]:
    """(where, flag) for each inline code span that is a flag on its own (`--x`, `--x VALUE`)."""
    out = []
    for path in doccheck.doc_files():
        for span in doccheck.spans(path):
            m = re.fullmatch(r"(--[a-z0-9][a-z0-9-]*)(?:[ =].*)?", span.text)
            if m and not span.fenced:
                out.append((span.where(), m.group(1)))
    return out


def test_every_flag_the_docs_cite_alone_is_an_option_of_a_command_they_document():
    unknown = [
        f"{where}: `{flag}`"
        for where, flag in cited_flags()
        if flag not in known_flags() and flag not in OUTSIDE_FLAGS and flag not in AWS_FLAGS
    ]
    assert not unknown, "no command takes these flags:\n" + "\n".join(unknown)
    for flag, argv in AWS_FLAGS.items():
        assert doccheck.aws_problems([*argv, "x"]) == [], flag
    assert len(cited_flags()) > 100  # the docs' flags are actually scanned


def test_the_checks_catch_a_renamed_flag_command_target_or_stack():
    """The checks themselves: each kind of mistake the docs could make is reported."""
    ops = doccheck.console_scripts()["flotilla"]
    assert doccheck.parse_problems(ops, ["status", "--json"]) == []
    assert "unrecognized arguments: --jsn" in " ".join(doccheck.parse_problems(ops, ["status", "--jsn"]))
    assert "invalid choice: 'statuss'" in " ".join(doccheck.parse_problems(ops, ["statuss"]))
    assert doccheck.parse_problems(ops, ["drain-unit", "UNIT", "--wait", "S"]) == []  # placeholders fill in
    assert doccheck.parse_problems(ops, ["keys"], naming=True) == []  # naming a command group
    assert doccheck.parse_problems(ops, ["keys"]) != []  # but running it needs a subcommand
    assert doccheck.parse_problems("runtime", ["router", "--drain-timeout", "60"]) == []
    assert "--retry-after" in " ".join(doccheck.parse_problems("runtime", ["router", "--retry-after", "1"]))
    assert doccheck.make_problems(("synth", "CONFIG=examples/x.yaml")) == []
    assert doccheck.make_problems(("synthh",)) == ["make: no target 'synthh' in the Makefile"]
    assert doccheck.make_problems(("deploy", "CONFG=x.yaml")) == ["make: the Makefile reads no variable CONFG"]
    assert doccheck.make_problems(("bench-trace", "BENCH_ARGS=--requests 40 --rates 1")) == []
    assert "--rate" in " ".join(doccheck.make_problems(("bench-trace", "BENCH_ARGS=--rate 1")))
    assert doccheck.cdk_problems(["deploy", "Cell-3", "--exclusively"], doccheck.stack_ids()) == []
    assert doccheck.cdk_problems(["deploy", "Cell3"], doccheck.stack_ids()) == [
        "cdk deploy: 'Cell3' is not a stack of the app"
    ]
    assert doccheck.cdk_problems(["deploy", "--no-rollbak"], doccheck.stack_ids()) == [
        "cdk deploy: unknown option --no-rollbak"
    ]
    assert doccheck.aws_problems(["ecs", "describe-servics", "--cluster", "c"]) == [
        "ecs: unknown command 'describe-servics'"
    ]
    assert doccheck.aws_problems(["ecs", "wait", "services-stable", "--cluster", "c", "--services", "s"]) == []
    skip = ["cloudformation", "continue-update-rollback", "--stack-name", "x", "--resources-to-skip", "A", "B"]
    assert doccheck.aws_problems(skip) == []  # a list member takes several values
    assert "unknown option --resource-to-skip" in " ".join(
        doccheck.aws_problems([*skip[:4], "--resource-to-skip", "A"])
    )
    assert "required option --stack-name missing" in " ".join(doccheck.aws_problems(skip[:2]))
    line = doccheck.Span(ROOT / "README.md", 1, "T=$(aws ecs list-tasks) && flotilla status --json > s.json", True)
    assert [(c.tool, c.argv) for c in doccheck.commands(line)] == [
        ("aws", ("ecs", "list-tasks")),
        ("flotilla", ("status", "--json")),
    ]
    synopsis = doccheck.Span(ROOT / "README.md", 1, "flotilla shed set / clear / show", False)
    assert [c.argv for c in doccheck.commands(synopsis)] == [("shed", "set"), ("shed", "clear"), ("shed", "show")]


def test_a_program_without_argparse_is_never_started_to_check_its_line(tmp_path, monkeypatch):
    script = tmp_path / "side_effect.py"
    script.write_text("import pathlib\npathlib.Path(__file__).with_suffix('.ran').write_text('x')\n")
    monkeypatch.setattr(doccheck, "ROOT", tmp_path)
    assert doccheck.parse_problems("side_effect.py", []) == []
    assert not script.with_suffix(".ran").exists()
