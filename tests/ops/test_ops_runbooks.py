"""The runbooks' commands exist, with the flags they give: each `flotilla ...` line in docs/runbooks
parses with the CLI's own argparse parser, each `aws ...` / `cdk ...` line is a command and options
the tool defines (botocore's service models, the CDK CLI's option registry). One test per runbook,
naming every line of it that a reader could not run. What each subcommand does is tested in its own
file (test_ops_status.py, test_ops_rollback.py, ...), against moto and real health servers."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from ops.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
RUNBOOKS = ROOT / "docs" / "runbooks"
FLEET_RUNBOOKS = [
    "scale-for-peak.md",
    "unit-not-ready.md",
    "node-replacement.md",
    "model-update.md",
    "rollback-units.md",
    "certificate-rotation.md",
    "incident-triage.md",
]
SHELL_BREAKS = {">", ">>", "<", "|", "&&", "||", ";", "2>&1"}


def flotilla_lines(path: Path) -> list[str]:
    """Command lines starting with `flotilla` inside the runbook's fenced code blocks."""
    lines, fenced = [], False
    for line in path.read_text().splitlines():
        if line.strip().startswith("```"):
            fenced = not fenced
            continue
        if fenced and line.strip().startswith("flotilla "):
            lines.append(line.strip())
    return lines


def argv_of(line: str) -> list[str]:
    words = shlex.split(line)
    for i, w in enumerate(words):
        if w in SHELL_BREAKS or w.startswith(">"):
            words = words[:i]
            break
    return words[1:]


def all_commands() -> list[tuple[str, str]]:
    return [(p.name, line) for p in sorted(RUNBOOKS.glob("*.md")) for line in flotilla_lines(p)]


def test_every_fleet_operation_runbook_exists_and_uses_the_cli():
    for name in FLEET_RUNBOOKS:
        path = RUNBOOKS / name
        assert path.is_file(), f"missing runbook {name}"
    used = {name for name, _ in all_commands()}
    # certificate rotation touches only the front door, but still checks the fleet before and after
    assert set(FLEET_RUNBOOKS) <= used


def check_flotilla(line: str) -> list[str]:
    """What the CLI's own parser says of a `flotilla ...` line: nothing when it parses to a command."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = build_parser().parse_args(argv_of(line))
    except SystemExit as done:  # argparse names the problem on stderr and exits 2
        if done.code == 0:  # --version (or --help): a line that runs and prints
            return []
        return [err.getvalue().strip().splitlines()[-1]]
    return [] if callable(getattr(args, "handler", None)) else ["parses to no command"]


# --- `aws` and `cdk` lines ------------------------------------------------------------------------
# Checked against the definitions the tools themselves use: botocore's service models (the AWS CLI
# builds its commands and options from them: operation and member names in kebab case) and the CDK
# CLI's own option registry (node_modules/aws-cdk/lib/cli/cli-type-registry.json).
AWS_GLOBAL_OPTIONS = {  # `aws help`: options every command takes; True = takes a value
    "region": True,
    "profile": True,
    "output": True,
    "query": True,
    "endpoint-url": True,
    "color": True,
    "cli-input-json": True,
    "cli-input-yaml": True,
    "max-items": True,
    "page-size": True,
    "starting-token": True,
    "no-cli-pager": False,
    "no-paginate": False,
    "debug": False,
}
# High-level commands the AWS CLI adds on top of the API (awscli customizations), by service.
AWS_CUSTOM_COMMANDS = {"s3": {"ls", "cp", "mv", "rm", "sync", "mb", "rb", "presign"}, "logs": {"tail"}}
CDK_REGISTRY = ROOT / "node_modules" / "aws-cdk" / "lib" / "cli" / "cli-type-registry.json"
STACK_ARG = re.compile(r"^(Network|Discovery|Cell-\d+|Front|Observability|Router|[A-Za-z0-9-]*\*)$")
SHELL_PUNCTUATION = set("();<>|&")


def shell_lines(path: Path) -> list[str]:
    """Fenced-block lines with backslash continuations joined."""
    out, fenced, pending = [], False, ""
    for line in path.read_text().splitlines():
        if line.strip().startswith("```"):
            fenced, pending = not fenced, ""
            continue
        if not fenced:
            continue
        text = pending + line.strip()
        if text.endswith("\\"):
            pending = text[:-1] + " "
            continue
        pending = ""
        out.append(text)
    return out


def tool_invocations(line: str) -> list[tuple[str, list[str]]]:
    """(tool, argv) for each `aws ...` or `cdk ...` command in a shell line, also inside $( ... )
    and after a pipe or &&; a word in double quotes is one argument, as the shell makes it."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        tokens = list(lexer)
    except ValueError:
        return []
    found = []
    for i, tok in enumerate(tokens):
        starts = i == 0 or set(tokens[i - 1]) <= SHELL_PUNCTUATION or tokens[i - 1] == "npx"
        tool = {"aws": "aws", "cdk": "cdk", "node_modules/.bin/cdk": "cdk"}.get(tok)
        if tool is None or not starts:
            continue
        argv = []
        for t in tokens[i + 1 :]:
            if set(t) <= SHELL_PUNCTUATION:
                break
            argv.append(t)
        found.append((tool, argv))
    return found


def all_tool_lines() -> list[tuple[str, str, str, list[str]]]:
    return [
        (p.name, line, tool, argv)
        for p in sorted(RUNBOOKS.glob("*.md"))
        for line in shell_lines(p)
        for tool, argv in tool_invocations(line)
    ]


def check_aws(argv: list[str]) -> list[str]:
    import botocore.session
    from botocore import xform_name
    from botocore.exceptions import UnknownServiceError

    if len(argv) < 2:
        return ["no service and command"]
    service, command = argv[0], argv[1]
    if command in AWS_CUSTOM_COMMANDS.get(service, set()):
        return []
    session = botocore.session.get_session()
    try:
        model = session.get_service_model(service)
    except UnknownServiceError:
        return [f"unknown service {service!r}"]
    rest = argv[2:]
    if command == "wait":
        waiters = {xform_name(w, "-"): w for w in session.get_waiter_model(service).waiter_names}
        if not rest or rest[0] not in waiters:
            return [f"{service} wait: unknown waiter {rest[:1]} (known: {sorted(waiters)})"]
        op = session.get_waiter_model(service).get_waiter(waiters[rest[0]]).operation
        rest = rest[1:]
    else:
        ops = {xform_name(o, "-"): o for o in model.operation_names}
        if command not in ops:
            return [f"{service}: unknown command {command!r}"]
        op = ops[command]
    shape = model.operation_model(op).input_shape
    members = {xform_name(m, "-"): (m, s) for m, s in (shape.members.items() if shape else [])}
    problems, given, i = [], set(), 0
    while i < len(rest):
        tok = rest[i]
        i += 1
        if not tok.startswith("--"):
            problems.append(f"unexpected argument {tok!r}")
            continue
        name = tok[2:].split("=", 1)[0]
        if name in AWS_GLOBAL_OPTIONS:
            given.add(name)
            takes_value = AWS_GLOBAL_OPTIONS[name]
        elif name in members:
            given.add(members[name][0])
            takes_value = members[name][1].type_name != "boolean"
        elif name.startswith("no-") and name[3:] in members and members[name[3:]][1].type_name == "boolean":
            given.add(members[name[3:]][0])
            takes_value = False
        else:
            problems.append(f"{service} {command}: unknown option --{name}")
            continue
        if takes_value and "=" not in tok:
            if i >= len(rest) or rest[i].startswith("--"):
                problems.append(f"--{name} needs a value")
            while i < len(rest) and not rest[i].startswith("--"):
                i += 1  # list members take several values
    if shape and not given & {"cli-input-json", "cli-input-yaml"}:
        missing = [xform_name(m, "-") for m in shape.required_members if m not in given]
        problems += [f"{service} {command}: required option --{m} missing" for m in missing]
    return problems


def check_cdk(argv: list[str]) -> list[str]:
    import json as _json

    registry = _json.loads(CDK_REGISTRY.read_text())
    commands = registry["commands"]
    aliases = {a: name for name, c in commands.items() for a in c.get("aliases", [])}
    if not argv:
        return ["no command"]
    name = aliases.get(argv[0], argv[0])
    if name not in commands:
        return [f"unknown cdk command {argv[0]!r}"]
    spec = commands[name]
    options = {**registry["globalOptions"], **spec.get("options", {})}
    short = {}
    for opt, o in options.items():
        for a in [o["alias"]] if isinstance(o.get("alias"), str) else o.get("alias", []):
            short[a] = opt
    problems, positional, i, rest = [], [], 0, argv[1:]
    while i < len(rest):
        tok = rest[i]
        i += 1
        if tok.startswith("--") or (tok.startswith("-") and len(tok) == 2):
            key = tok.lstrip("-").split("=", 1)[0]
            key = short.get(key, key) if not tok.startswith("--") else key
            if key not in options and key.startswith("no-") and options.get(key[3:], {}).get("type") == "boolean":
                continue
            if key not in options:
                problems.append(f"cdk {name}: unknown option {tok}")
                continue
            if options[key].get("type") == "boolean":
                continue
            value = tok.split("=", 1)[1] if "=" in tok else (rest[i] if i < len(rest) else None)
            if "=" not in tok:
                i += 1
            if value is None:
                problems.append(f"cdk {name}: {tok} needs a value")
            elif "choices" in options[key] and value not in options[key]["choices"]:
                problems.append(f"cdk {name}: {tok} {value!r} not one of {options[key]['choices']}")
        else:
            positional.append(tok)
    if spec.get("arg", {}).get("name") == "STACKS":
        problems += [f"cdk {name}: {p!r} is not a stack of the app" for p in positional if not STACK_ARG.match(p)]
    elif positional and not spec.get("arg"):
        problems.append(f"cdk {name} takes no arguments: {positional}")
    return problems


RUNBOOK_FILES = sorted(p.name for p in RUNBOOKS.glob("*.md") if p.name != "README.md")


@pytest.mark.parametrize("runbook", RUNBOOK_FILES)
def test_every_command_of_the_runbook_exists_with_the_flags_it_gives(runbook):
    path = RUNBOOKS / runbook
    problems = [f"`{line}`: {p}" for line in flotilla_lines(path) for p in check_flotilla(line)]
    for name, line, tool, argv in all_tool_lines():
        if name == runbook:
            problems += [f"`{line}`: {p}" for p in (check_aws(argv) if tool == "aws" else check_cdk(argv))]
    assert not problems, f"{runbook}: " + "\n".join(problems)


def test_the_command_checks_catch_what_they_should():
    assert check_flotilla("flotilla status --deployment prod") == []
    assert "invalid choice: 'statuss'" in " ".join(check_flotilla("flotilla statuss"))
    assert "unrecognized arguments: --no-such-flag" in " ".join(check_flotilla("flotilla status --no-such-flag"))
    assert len(all_commands()) > 20  # the runbooks' flotilla lines are actually scanned
    assert check_aws(["ecs", "update-service", "--cluster", "c", "--service", "s", "--desired-count", "0"]) == []
    assert (
        check_aws(["cloudformation", "continue-update-rollback", "--stack-name", "x", "--resources-to-skip", "A", "B"])
        == []
    )
    assert "unknown option --resource-to-skip" in " ".join(
        check_aws(["cloudformation", "continue-update-rollback", "--stack-name", "x", "--resource-to-skip", "A"])
    )
    assert "required option --stack-name missing" in " ".join(check_aws(["cloudformation", "continue-update-rollback"]))
    assert check_aws(["ecs", "wait", "services-stable", "--cluster", "c", "--services", "s"]) == []
    assert check_aws(["ecs", "describe-servics", "--cluster", "c"]) == ["ecs: unknown command 'describe-servics'"]
    assert check_cdk(["deploy", "Cell-0", "-c", "config=x.yaml", "--require-approval", "broadening"]) == []
    assert check_cdk(["deploy", "--require-approval", "sometimes"]) != []
    assert check_cdk(["deploy", "Cell0"]) == ["cdk deploy: 'Cell0' is not a stack of the app"]
    assert check_cdk(["destroy", "--all", "--force"]) == []
    assert ("aws", ["ecs", "list-tasks"]) in tool_invocations('T=$(aws ecs list-tasks) && echo "$T"')
    lines = [argv for _, _, tool, argv in all_tool_lines() if tool in ("aws", "cdk")]
    assert len(lines) > 20  # the runbooks are actually scanned


INCIDENT_RUNBOOKS = [
    "capacity-shortage.md",
    "stuck-ecs-deployment.md",
    "stuck-cell-stack.md",
    "update-rollback-failed.md",
    "emergency-stop.md",
    "teardown.md",
]


def test_every_runbook_is_in_the_index_and_the_incident_runbooks_exist():
    index = (RUNBOOKS / "README.md").read_text()
    for name in INCIDENT_RUNBOOKS:
        assert (RUNBOOKS / name).is_file(), f"missing runbook {name}"
    for path in sorted(RUNBOOKS.glob("*.md")):
        if path.name != "README.md":
            assert f"]({path.name})" in index, f"docs/runbooks/README.md does not list {path.name}"


def test_the_update_rollback_failed_runbook_skips_resources_and_checks_afterwards():
    lines = [argv for name, _, tool, argv in all_tool_lines() if name == "update-rollback-failed.md" and tool == "aws"]
    commands = [tuple(a[:2]) for a in lines]
    skip = next(
        a for a in lines if a[:2] == ["cloudformation", "continue-update-rollback"] and "--resources-to-skip" in a
    )
    after = commands[lines.index(skip) + 1 :]
    assert ("cloudformation", "detect-stack-drift") in after and (
        "cloudformation",
        "describe-stack-resource-drifts",
    ) in after
