"""The command lines of the project's Markdown (README.md and docs/), found in code blocks and inline
code, and checked against what defines them: the project's own argparse parsers (run in-process up to
their parse, never further), the Makefile's targets and variables, the pinned CDK CLI's option registry
and botocore's service models (what the AWS CLI builds its commands from). What is valid is always read
from those definitions, so a command or flag added to a CLI is known here the moment it lands."""

from __future__ import annotations

import argparse
import ast
import contextlib
import fnmatch
import io
import json
import re
import runpy
import shlex
import sys
import tomllib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from importlib.util import find_spec
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAKEFILE = ROOT / "Makefile"
CDK_REGISTRY = ROOT / "node_modules" / "aws-cdk" / "lib" / "cli" / "cli-type-registry.json"
# The one way the docs call the CDK CLI: the pinned one the Makefile runs (package.json: "call
# node_modules/.bin/cdk, never a global cdk"), or a make target.
CDK_BINARY = "node_modules/.bin/cdk"
SHELL_PUNCTUATION = set("();<>|&")
PLACEHOLDER = "__PH__"  # what <name> placeholders become before the shell lexer sees their < and >


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@dataclass(frozen=True)
class Span:
    """A piece of code in a document: a line of a code block (continuations joined) or inline code."""

    path: Path
    line: int
    text: str
    fenced: bool

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def spans(path: Path) -> Iterator[Span]:
    lines = path.read_text().splitlines()
    fenced, pending, start = False, "", 0
    paragraph: list[tuple[int, str]] = []
    for n, line in enumerate(lines, 1):
        stripped = line.strip()
        if stripped.startswith("```") or stripped.startswith("~~~"):
            yield from _inline(path, paragraph)
            paragraph, fenced, pending, start = [], not fenced, "", 0
            continue
        if fenced:
            text = pending + stripped
            if text.endswith("\\"):  # a shell continuation: one command over several lines
                pending, start = text[:-1] + " ", start or n
                continue
            yield Span(path, start or n, text, True)
            pending, start = "", 0
        elif stripped:
            paragraph.append((n, line))
        else:
            yield from _inline(path, paragraph)
            paragraph = []
    yield from _inline(path, paragraph)


def _inline(path: Path, paragraph: list[tuple[int, str]]) -> Iterator[Span]:
    """Inline code of one paragraph (a span may continue on the next line, as Markdown allows)."""
    text = " ".join(line for _, line in paragraph)
    offsets, at = [], 0
    for n, line in paragraph:
        offsets.append((at, n))
        at += len(line) + 1
    for m in re.finditer(r"(`+)(.+?)\1", text):
        line = max(n for off, n in offsets if off <= m.start()) if offsets else 0
        yield Span(path, line, m.group(2).strip(), False)


# --- Command lines --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    tool: str  # flotilla, flotilla-node, python, make, cdk, aws
    argv: tuple[str, ...]  # what follows the tool: for python, ("-m", module, ...) or (path, ...)
    how: str  # the words that called the tool, e.g. "npx cdk" or ".venv/bin/python"
    span: Span

    def line(self) -> str:
        return f"{self.how} {' '.join(self.argv)}".strip()


@cache
def console_scripts() -> dict[str, str]:
    """pyproject.toml's console scripts: name -> "module:function"."""
    return dict(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])


def _lex(text: str) -> list[str] | None:
    lexer = shlex.shlex(
        re.sub(r"<([^<>\s]+)>", rf"{PLACEHOLDER}\1{PLACEHOLDER}", text), posix=True, punctuation_chars=True
    )
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        return list(lexer)
    except ValueError:  # an unbalanced quote: prose, a heredoc, a fragment
        return None


def _segments(tokens: list[str]) -> Iterator[list[str]]:
    """The simple commands of a shell line: split at pipes, lists, subshells and redirections."""
    current: list[str] = []
    for tok in tokens:
        if set(tok) <= SHELL_PUNCTUATION or tok.startswith((">", "2>", "<")):
            if current:
                yield current
            current = []
            continue
        current.append(tok)
    if current:
        yield current


def _command(words: list[str], span: Span) -> Command | None:
    while words and (re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]) or words[0] in ("env", "time", "$")):
        words = words[1:]  # VAR=value prefixes
    if not words:
        return None
    head, rest = words[0], tuple(words[1:])
    if head == "npx" and rest[:1] == ("cdk",):
        return Command("cdk", rest[1:], "npx cdk", span)
    if head in ("cdk", CDK_BINARY, f"./{CDK_BINARY}"):
        return Command("cdk", rest, head, span)
    if head in console_scripts() or head in ("make", "aws"):
        return Command(head, rest, head, span)
    if re.fullmatch(r"(\S*/)?python3?(\.\d+)?", head) and rest:
        return Command("python", rest, head, span)
    return None


def commands(span: Span) -> list[Command]:
    """Every command line of a tool the docs document in this span, also after pipes and inside $(...);
    an inline synopsis `a b / c / d` counts as `a b`, `a c` and `a d`."""
    texts = [span.text]
    if not span.fenced and " / " in span.text:
        texts = _alternatives(span.text)
    out = []
    for text in texts:
        tokens = _lex(text)
        if tokens is None:
            continue
        for words in _segments(tokens):
            found = _command(words, span)
            if found is not None:
                out.append(found)
    return out


def _alternatives(text: str) -> list[str]:
    first, *others = [part.strip() for part in text.split(" / ")]
    words = first.split()
    out = [first]
    for alt in others:
        if alt.startswith("-"):  # other flags of the same command
            base = words[: next((i for i, w in enumerate(words) if w.startswith("-")), len(words))]
        else:  # other subcommands in the last word's place
            base = words[:-1]
        out.append(" ".join([*base, alt]))
    return out


@cache
def all_commands() -> tuple[Command, ...]:
    return tuple(c for path in doc_files() for span in spans(path) for c in commands(span))


def is_placeholder(word: str) -> bool:
    """A value the reader fills in: <name>, N, PATH, $VAR, "$(...)", ... ."""
    return (
        PLACEHOLDER in word
        or bool(re.fullmatch(r"[A-Z][A-Z0-9_]*", word))
        or word.startswith("$")
        or word in ("...", "…")
    )


# --- argparse CLIs, parsed in-process ----------------------------------------------------------------


def parse_problems(entry: str, argv: list[str], *, naming: bool = False) -> list[str]:
    """What the CLI's own parser says of `argv`, nothing when it parses. `entry` is "module" (run as
    `python -m module`), "path.py" (run as a file) or "module:function" (a console script). `naming`: a
    mention that names a command rather than runs it, so arguments it leaves out are not a problem."""
    argv = [w.strip("[]") if w.startswith("[") or w.endswith("]") else w for w in argv]
    argv = [w for w in argv if w]
    try:
        parser = cli_parser(entry)
    except LookupError as exc:
        return [str(exc)]
    if parser is None:
        return [f"{entry} reads no options, yet the docs give it {argv}"] if argv else []
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            _REAL_PARSE_ARGS(parser, _fill_placeholders(parser, argv))
    except SystemExit as exc:
        if exc.code not in (0, None):
            message = err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {exc.code}"
            if not (naming and _only_missing(message)):
                return [message]
    return []


_REAL_PARSE_ARGS = argparse.ArgumentParser.parse_args


class _Parsed(BaseException):  # BaseException: no `except Exception` in a main() can swallow it
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


@cache
def cli_parser(entry: str) -> argparse.ArgumentParser | None:
    """The parser a program builds, caught as it calls parse_args (the program stops there and does
    nothing else). None for a program without argparse; LookupError when there is no such program.
    Only programs whose source parses arguments with argparse are started (a script without it would
    run in full)."""
    if not _parses_arguments(entry):
        return None

    def intercept(self: argparse.ArgumentParser, args=None, namespace=None):  # noqa: ARG001
        raise _Parsed(self)

    saved_argv = sys.argv
    argparse.ArgumentParser.parse_args = intercept  # type: ignore[method-assign]
    try:
        sys.argv = [entry, "--help"]
        with contextlib.redirect_stdout(io.StringIO()):
            if ":" in entry:
                module, function = entry.split(":")
                getattr(__import__(module, fromlist=[function]), function)(["--help"])
            elif entry.endswith(".py"):
                runpy.run_path(str(ROOT / entry), run_name="__main__")
            else:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)  # runpy: "found in sys.modules"
                    runpy.run_module(entry, run_name="__main__", alter_sys=True)
    except _Parsed as parsed:
        _no_abbreviations(parsed.parser)
        return parsed.parser
    finally:
        argparse.ArgumentParser.parse_args = _REAL_PARSE_ARGS  # type: ignore[method-assign]
        sys.argv = saved_argv
    raise LookupError(f"{entry}: never parsed its arguments")


def _no_abbreviations(parser: argparse.ArgumentParser) -> None:
    """A doc must spell a flag out: argparse would take `--rate` for `--rates`, so a flag renamed to a
    longer name would still pass."""
    parser.allow_abbrev = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _no_abbreviations(sub)


def _parses_arguments(entry: str) -> bool:
    """Whether the program's source (or, for a package, its __main__'s, or the module it takes main
    from) calls parse_args; LookupError when the module or file does not exist."""
    if ":" in entry:
        return True  # a console script of pyproject.toml: the project's CLIs
    if entry.endswith(".py"):
        path = ROOT / entry
    else:
        try:
            spec = find_spec(entry)
            if spec is not None and spec.submodule_search_locations is not None:
                spec = find_spec(f"{entry}.__main__")
        except ModuleNotFoundError:
            spec = None
        if spec is None or not spec.origin:
            raise LookupError(f"python -m {entry}: no such module")
        path = Path(spec.origin)
    if not path.is_file():
        raise LookupError(f"{entry}: no such file")
    source = path.read_text()
    if "parse_args(" in source:
        return True
    taken = re.search(r"^from ([\w.]+) import main$", source, re.M)
    return bool(taken) and _parses_arguments(taken.group(1))


def _only_missing(message: str) -> bool:
    return "the following arguments are required" in message or "one of the arguments" in message


def _fill_placeholders(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """argv with each placeholder replaced by a value its option accepts (a number for a number, the
    first choice for a choice), so that only real names are put to the test."""
    out, current = [], parser
    for i, word in enumerate(argv):
        subparsers = [a for a in current._actions if isinstance(a, argparse._SubParsersAction)]
        if subparsers and word in subparsers[0].choices:
            current = subparsers[0].choices[word]
        if is_placeholder(word):
            action = current._option_string_actions.get(argv[i - 1].split("=")[0]) if i else None
            takes_value = action is not None and action.nargs != 0
            if word in ("...", "…") and not takes_value:
                continue  # "and so on", not a value
            if takes_value and action is not None and action.choices:
                word = str(next(iter(action.choices)))
            elif takes_value and action is not None and action.type in (int, float):
                word = "1"
        out.append(word)
    return out


def _ours(origin: Path) -> bool:
    """Whether a module's file is this repository's code: under the checkout, but not an installed
    package (the checkout's own .venv lies under it too, as `make test` makes it in a fresh clone)."""
    path = origin.resolve()
    return ROOT in path.parents and "site-packages" not in path.parts


def python_entry(argv: tuple[str, ...]) -> tuple[str, list[str]] | None:
    """(entry, arguments) of a `python ...` line that runs this repository's code, None otherwise
    (a third-party module such as json.tool, python -c, an inline script)."""
    if argv[0] == "-m" and len(argv) > 1:
        if is_placeholder(argv[1]):
            return None
        try:
            spec = find_spec(argv[1])
        except ModuleNotFoundError:  # a package of its path is missing: not a module of this repository
            return (argv[1], list(argv[2:])) if (ROOT / argv[1].split(".")[0]).is_dir() else None
        if spec is not None and spec.origin and not _ours(Path(spec.origin)):
            return None  # json.tool, pytest, vllm...: not this repository's
        if spec is None and not (ROOT / argv[1].split(".")[0]).is_dir():
            return None
        return argv[1], list(argv[2:])
    if argv[0].endswith(".py") and not argv[0].startswith(("/", "-", ".")) and not is_placeholder(argv[0]):
        return argv[0], list(argv[1:])
    return None


def python_strings(*folders: str, scripts_only: bool = False) -> list[str]:
    """Every string constant (f-string parts included) of the Python code under these folders, but the
    docstrings. scripts_only: only what could be a command line, a constant that is a single flag or
    spans lines (user data, a shell script); never a one-line message that merely mentions a flag."""
    out = []
    for folder in folders:
        for path in sorted(ROOT.glob(f"{folder}/**/*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            docstrings = {
                id(node.body[0].value)
                for node in ast.walk(tree)
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and node.body
                and isinstance(node.body[0], ast.Expr)
                and isinstance(node.body[0].value, ast.Constant)
            }
            for n in ast.walk(tree):
                if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings:
                    if not scripts_only or "\n" in n.value or re.fullmatch(r"--[a-z][a-z0-9-]*", n.value):
                        out.append(n.value)
    return out


# --- make ------------------------------------------------------------------------------------------


@cache
def make_targets() -> frozenset[str]:
    text = MAKEFILE.read_text()
    found = set()
    for names in re.findall(r"^([A-Za-z0-9_.$()/ -]+?)\s*:(?!=)", text, re.M):
        found.update(n for n in names.split() if "$" not in n)
    return frozenset(found - {".PHONY"})


@cache
def make_variables() -> frozenset[str]:
    """Variables the Makefile reads or sets; command-line assignments of others do nothing."""
    text = MAKEFILE.read_text()
    read = set(re.findall(r"\$[({]([A-Z_][A-Z0-9_]*)[)}]", text))
    read |= set(re.findall(r"^(?:export\s+)?([A-Z_][A-Z0-9_]*)\s*[:?+]?=", text, re.M))
    return frozenset(read)


@cache
def make_passes_args() -> dict[tuple[str, str], str]:
    """(target, VAR) -> the module the target runs with $(VAR) as its arguments (BENCH_ARGS, LOCAL_ARGS)."""
    out = {}
    for target in make_targets():
        for line in recipe(target):
            m = re.search(r"\$\(PY\) -m ([\w.]+)\b.*\$\(([A-Z_]+_ARGS)\)", line)
            if m:
                out[(target, m.group(2))] = m.group(1)
    return out


def recipe(target: str) -> list[str]:
    """The recipe lines of a target (the tab-indented lines after its rule)."""
    lines = MAKEFILE.read_text().splitlines()
    rule = re.compile(rf"^(?:[^:=#\s]+\s+)*{re.escape(target)}(?:\s+[^:=#\s]+)*\s*:(?!=)")
    start = next((i for i, line in enumerate(lines) if rule.match(line) and not line.startswith(".PHONY")), None)
    if start is None:
        return []
    out = []
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        out.append(line.strip())
    return out


def make_problems(argv: tuple[str, ...], *, environment: frozenset[str] = frozenset()) -> list[str]:
    """Targets the Makefile lacks, variables it never reads, and *_ARGS its module's parser refuses."""
    problems, targets, i = [], [], 0
    words = list(argv)
    while i < len(words):
        w = words[i]
        i += 1
        if w in ("-C", "-f", "-j", "-o", "-W"):
            i += 1
        elif w.startswith("-"):
            continue
        elif "=" in w:
            name, value = w.split("=", 1)
            if name not in make_variables() and name not in environment:
                problems.append(f"make: the Makefile reads no variable {name}")
            for target in targets or ["?"]:
                module = make_passes_args().get((target, name))
                if module and not is_placeholder(value):
                    problems += [f"{name}: {p}" for p in parse_problems(module, shlex.split(value))]
        elif not is_placeholder(w):
            if not any(fnmatch.fnmatchcase(t, w) for t in make_targets()):
                problems.append(f"make: no target {w!r} in the Makefile")
            targets.append(w)
    return problems


# --- the CDK CLI and the AWS CLI ------------------------------------------------------------------


@cache
def _cdk_registry() -> dict:
    return json.loads(CDK_REGISTRY.read_text())


def cdk_problems(argv: list[str], stack_names: re.Pattern[str], *, naming: bool = False) -> list[str]:
    argv = [w for w in argv if w not in ("...", "…")]
    registry = _cdk_registry()
    commands_ = registry["commands"]
    aliases = {a: name for name, c in commands_.items() for a in c.get("aliases", [])}
    if not argv:
        return [] if naming else ["no command"]
    name = aliases.get(argv[0], argv[0])
    if name not in commands_:
        return [f"unknown cdk command {argv[0]!r}"]
    spec = commands_[name]
    options = {**registry["globalOptions"], **spec.get("options", {})}
    short = {}
    for opt, o in options.items():
        for a in [o["alias"]] if isinstance(o.get("alias"), str) else o.get("alias", []):
            short[a] = opt
    problems, positional, i, rest = [], [], 0, argv[1:]
    while i < len(rest):
        tok = rest[i]
        i += 1
        if tok in ("--help", "-h"):
            continue
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
            if value is None and not naming:
                problems.append(f"cdk {name}: {tok} needs a value")
            elif "choices" in options[key] and value not in options[key]["choices"] and not is_placeholder(value):
                problems.append(f"cdk {name}: {tok} {value!r} not one of {options[key]['choices']}")
        else:
            positional.append(tok)
    if spec.get("arg", {}).get("name") == "STACKS":
        bad = [p for p in positional if not (stack_names.fullmatch(p) or is_placeholder(p))]
        problems += [f"cdk {name}: {p!r} is not a stack of the app" for p in bad]
    elif positional and not spec.get("arg"):
        problems.append(f"cdk {name} takes no arguments: {positional}")
    return problems


def cdk_option_names() -> set[str]:
    registry = _cdk_registry()
    names = set(registry["globalOptions"])
    for spec in registry["commands"].values():
        names |= set(spec.get("options", {}))
    return {f"--{n}" for n in names} | {f"--no-{n}" for n in names}


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
AWS_CUSTOM_COMMANDS = {
    "s3": {"ls", "cp", "mv", "rm", "sync", "mb", "rb", "presign"},
    "logs": {"tail"},
    "ecr": {"get-login-password"},
}


@cache
def _botocore_session():  # loading service models is the slow part: once per process
    import botocore.session

    return botocore.session.get_session()


def aws_problems(argv: list[str], *, naming: bool = False) -> list[str]:
    from botocore import xform_name
    from botocore.exceptions import UnknownServiceError

    argv = [w for w in argv if not is_placeholder(w) or not naming]
    if len(argv) < 2:
        return [] if naming and all(is_placeholder(w) for w in argv) else ["no service and command"]
    service, command = argv[0], argv[1]
    if command in AWS_CUSTOM_COMMANDS.get(service, set()):
        return []
    session = _botocore_session()
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
            if (i >= len(rest) or rest[i].startswith("--")) and not naming:
                problems.append(f"--{name} needs a value")
            while i < len(rest) and not rest[i].startswith("--"):
                i += 1  # list members take several values
    if shape and not naming and not given & {"cli-input-json", "cli-input-yaml"}:
        missing = [xform_name(m, "-") for m in shape.required_members if m not in given]
        problems += [f"{service} {command}: required option --{m} missing" for m in missing]
    return problems


# --- The CDK app -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class App:
    templates: dict[str, dict]  # stack id ("Front", "Cell-0") -> its CloudFormation template
    deployment_name: str  # the stacks' names are "<deployment_name>-<id>"


# Front doors whose stacks carry outputs the default lacks (the WAF's, the PrivateLink service's):
# the runbooks for them cite those outputs.
FRONT_DOOR_VARIANTS = (
    '{"certificate_arn": "arn:aws:acm:us-east-1:123456789012:certificate/11111111-2222-3333-4444-555555555555",'
    ' "front": {"scheme": "internet-facing", "client_cidrs": ["203.0.113.0/24"]}}',
    '{"front": {"privatelink_principals": ["arn:aws:iam::210987654321:root"]}}',
)


@cache
def synthesized(overrides: str = "{}") -> App:
    """The default deployment (cdk.json), with `overrides` (JSON of config keys) merged in, synthesized
    in-process as app.py does, once per session."""
    import tempfile

    import aws_cdk as cdk

    from stacks.config import _deep_merge, parse_config
    from stacks.deployment import build_deployment

    context = json.loads((ROOT / "cdk.json").read_text())["context"]
    config = parse_config(_deep_merge(context["flotilla"], json.loads(overrides)))
    app = cdk.App(builtin_cloud_formation_validation=False, context=context, outdir=tempfile.mkdtemp(prefix="docs-"))
    build_deployment(app, config)
    assembly = app.synth()
    stacks = [c for c in app.node.children if isinstance(c, cdk.Stack)]
    templates = {s.node.id: assembly.get_stack_by_name(s.stack_name).template for s in stacks}
    return App(templates=templates, deployment_name=config.deployment_name)


def stack_ids() -> re.Pattern[str]:
    """The app's stack ids (a cell's number any number) and `*` globs, as `cdk` takes them."""
    ids = {re.sub(r"-\d+$", r"-\\d+", s) for s in synthesized().templates}
    return re.compile(rf"({'|'.join(sorted(ids))}|[A-Za-z0-9-]*\*)")
