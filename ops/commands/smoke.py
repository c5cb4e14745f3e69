"""`flotilla smoke`: real requests through a fleet's front door with the official `openai` client,
checked, and a pass/fail table of what was seen. Run it against a staging or new fleet's ALB URL
(the Front stack's `Url` output) or against `make local`.

Each check is one request a client would make: list the models; a chat completion, whole and
streamed; a legacy completion; and a request the API must refuse with OpenAI's error shape. The
client retries nothing (max_retries=0) and every request has a timeout, so a failing fleet fails
the smoke test in bounded time instead of hiding behind retries.

With --roll-unit it also rolls one unit to a new task definition revision and back while requests
keep flowing, the way a deploy rolls it: ECS UpdateService with a new task definition starts a new
deployment and the service scheduler replaces the tasks within the service's minimum healthy and
maximum percent ("If you update the task definition ... Amazon ECS starts a new deployment",
UpdateService, ECS API reference). Each step waits for that deployment to be COMPLETED and the unit
ready on the target revision; every request sent meanwhile must succeed.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from contract.declare import Integer, Number
from ops.aws import clients_for
from ops.commands import Subparsers
from ops.commands.common import (
    add_confirm_options,
    add_json_option,
    confirmed,
    fleet_from_args,
    prose_console,
    wait_until,
)
from ops.commands.rollback import _describe, _registerable, revision_of
from ops.commands.rollout import COMPLETED, FAILED, rollout_state
from ops.errors import EXIT_FAILED, EXIT_OK, FlagType, OpsError, bad_arg, check_arg

PROMPT = "Name three primary colours."
API_KEY_ENV = "FLOTILLA_API_KEY"


@dataclass
class Check:
    name: str
    ok: bool
    saw: str
    seconds: float
    skipped: bool = False


# Without --roll-unit (make local has no ECS service to roll) the roll row says why it did not run.
ROLL_SKIPPED = "skipped: no --roll-unit given (make local has no ECS service to roll; give a unit of a deployed fleet)"


def add_parser(sub: Subparsers) -> list[argparse.ArgumentParser]:
    p = sub.add_parser(
        "smoke",
        help="send real requests (openai client, streamed and not) through the front door and check the answers",
        description="Smoke-test a fleet from a client's side: models, chat (whole and streamed), "
        "completions, and a refused request, each checked; prints a pass/fail table and exits 1 if any "
        "check failed.",
    )
    p.add_argument("--url", required=True, help="the fleet's base URL: the Front stack's Url output, or make local's")
    p.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV, "none"),
        help=f"Bearer key the routers accept (default: ${API_KEY_ENV}, else 'none' for a fleet without keys)",
    )
    p.add_argument("--max-tokens", type=int, default=16, help="tokens per answer; default %(default)s")
    p.add_argument(
        "--timeout",
        type=FlagType("--timeout", Number(0, 600, "seconds", above=True)),
        default=60.0,
        metavar="SECONDS",
        help="per request; default %(default)s",
    )
    p.add_argument(
        "--roll-unit",
        metavar="UNIT",
        help="also roll this unit (e.g. cell0-unit0) to a new task definition revision and back while requests "
        "keep flowing; uses the AWS options below (--deployment, --region)",
    )
    p.add_argument(
        "--wait",
        type=FlagType("--wait", Number(0, 7200, "seconds", above=True)),
        default=900.0,
        metavar="SECONDS",
        help="with --roll-unit: how long each of the two deployments may take; default %(default)s",
    )
    add_confirm_options(p)  # the roll changes the unit's service: asked first, like every change
    add_json_option(p, "each check's result")
    p.set_defaults(handler=run_smoke)
    return [p]


def _timed(name: str, fn: Callable[[], tuple[bool, str]]) -> Check:
    t0 = time.monotonic()
    try:
        ok, saw = fn()
    except Exception as exc:  # noqa: BLE001 - every failure is a failed check with what was seen
        ok, saw = False, f"{type(exc).__name__}: {str(exc)[:200]}"
    return Check(name, ok, saw, time.monotonic() - t0)


def run_checks(client: Any, *, max_tokens: int, seen: dict[str, Any] | None = None) -> list[Check]:
    """The checks in order; a later one uses what an earlier one learned (the model name), which is
    left in `seen` for the caller too."""
    import openai  # noqa: PLC0415 - loaded only by this command (every other command starts faster)

    seen = {} if seen is None else seen

    def models() -> tuple[bool, str]:
        ids = [m.id for m in client.models.list().data]
        seen["model"] = ids[0] if ids else None
        return bool(ids), f"models: {', '.join(ids) or 'none'}"

    def messages() -> list[dict[str, str]]:
        return [{"role": "user", "content": PROMPT}]

    def chat() -> tuple[bool, str]:
        r = client.chat.completions.create(
            model=seen["model"], messages=messages(), max_tokens=max_tokens, temperature=0
        )
        choice = r.choices[0]
        text = choice.message.content or ""
        seen["chat"] = text
        used = r.usage.completion_tokens if r.usage else 0
        ok = bool(text) and choice.finish_reason in ("stop", "length") and 1 <= used <= max_tokens
        return ok, f"{used} tokens, finish {choice.finish_reason}: {text[:60]!r}"

    def chat_stream() -> tuple[bool, str]:
        parts: list[str] = []
        finish = None
        chunks = 0
        stream = client.chat.completions.create(
            model=seen["model"], messages=messages(), max_tokens=max_tokens, temperature=0, stream=True
        )
        for chunk in stream:
            chunks += 1
            for choice in chunk.choices:
                parts.append(choice.delta.content or "")
                finish = choice.finish_reason or finish
        text = "".join(parts)
        same = "same text as the whole answer" if text == seen.get("chat") else "text differs from the whole answer"
        ok = bool(text) and finish in ("stop", "length") and chunks >= 2
        return ok, f"{chunks} chunks, finish {finish}, {same}: {text[:40]!r}"

    def completion() -> tuple[bool, str]:
        r = client.completions.create(model=seen["model"], prompt=PROMPT, max_tokens=max_tokens, temperature=0)
        text = r.choices[0].text
        return bool(text) and r.choices[0].finish_reason in ("stop", "length"), f"{text[:60]!r}"

    def refused() -> tuple[bool, str]:
        try:
            client.chat.completions.create(model=seen["model"], messages=messages(), max_tokens=-1)
        except openai.BadRequestError as err:
            body = err.body if isinstance(err.body, dict) else {}
            message = body.get("message") or str(err)
            return err.status_code == 400 and bool(message), f"400: {str(message)[:80]}"
        return False, "max_tokens=-1 was accepted"

    checks = [_timed("models", models)]
    if not checks[0].ok:
        return checks
    for name, fn in (
        ("chat", chat),
        ("chat, streamed", chat_stream),
        ("completion", completion),
        ("bad request refused", refused),
    ):
        checks.append(_timed(name, fn))
    return checks


@dataclass
class Traffic:
    """Chat requests, whole and streamed in turn, sent one after another on a thread of their own
    until stopped: what clients keep doing while a unit rolls."""

    client: Any
    model: str
    max_tokens: int
    sent: int = 0
    failed: int = 0
    first_failure: str = ""
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _one(self, stream: bool) -> None:
        messages = [{"role": "user", "content": PROMPT}]
        if stream:
            chunks = self.client.chat.completions.create(
                model=self.model, messages=messages, max_tokens=self.max_tokens, temperature=0, stream=True
            )
            finish = None
            for chunk in chunks:
                for choice in chunk.choices:
                    finish = choice.finish_reason or finish
            if finish not in ("stop", "length"):
                raise RuntimeError(f"stream ended without a finish reason ({finish})")
            return
        r = self.client.chat.completions.create(
            model=self.model, messages=messages, max_tokens=self.max_tokens, temperature=0
        )
        if not r.choices or r.choices[0].finish_reason not in ("stop", "length"):
            raise RuntimeError("answer without a finish reason")

    def _run(self) -> None:
        while not self._stop.is_set():
            stream = self.sent % 2 == 1
            self.sent += 1
            try:
                self._one(stream)
            except Exception as exc:  # noqa: BLE001 - a failed request is counted and shown, not raised
                self.failed += 1
                if not self.first_failure:
                    self.first_failure = f"{type(exc).__name__}: {str(exc)[:120]}"
                self._stop.wait(0.2)  # a failing front door is not hammered

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="smoke-traffic", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)


def roll_unit(args: argparse.Namespace, client: Any, *, model: str, console: Console) -> Check:
    """Roll args.roll_unit to a copy of its task definition (a new revision) and back under traffic.
    The copy is deregistered at the end, so the unit's rollback targets are unchanged."""
    t0 = time.monotonic()
    aws = clients_for(args)
    unit = fleet_from_args(args, aws).unit(args.roll_unit)
    original = unit.task_definition_arn
    described = _describe(aws, original)
    if described is None:
        raise OpsError(f"{unit.unit_id}: its task definition {original} is not known to ECS")
    doc, tags = described
    params: dict[str, Any] = _registerable(doc)
    if tags:
        params["tags"] = tags
    copy = aws.ecs.register_task_definition(**params)["taskDefinition"]["taskDefinitionArn"]
    numbers = [original.rsplit(":", 1)[-1], copy.rsplit(":", 1)[-1]]
    traffic = Traffic(client, model, args.max_tokens)
    traffic.start()
    steps: list[str] = []
    try:
        for target in (copy, original):
            aws.ecs.update_service(cluster=unit.cluster_arn, service=unit.service_name, taskDefinition=target)

            def on_target(target: str = target) -> tuple[bool, str]:
                now = fleet_from_args(args, aws, clusters={unit.cluster_arn}).unit(unit.unit_id)
                state = rollout_state(now)
                if state == FAILED:
                    raise OpsError(f"{unit.unit_id}: the deployment to {target.rsplit('/', 1)[-1]} FAILED")
                done = now.task_definition_arn == target and state == COMPLETED and now.ready
                return done, f"{state}, {'ready' if now.ready else 'not ready'}, {traffic.sent} requests"

            wait_until(
                on_target,
                timeout_s=args.wait,
                description=f"{unit.unit_id} -> task definition revision {target.rsplit(':', 1)[-1]}",
                console=console,
            )
            steps.append(target.rsplit(":", 1)[-1])
    except OpsError as err:
        traffic.stop(args.timeout)
        return Check(f"roll {unit.unit_id}", False, f"{err}; {traffic.sent} requests, {traffic.failed} failed", 0.0)
    finally:
        traffic.stop(args.timeout)
        aws.ecs.deregister_task_definition(taskDefinition=copy)
    ok = traffic.sent >= 1 and traffic.failed == 0 and steps == numbers[::-1]
    saw = (
        f"revision {numbers[0]} -> {numbers[1]} -> {numbers[0]} (revision label {revision_of(doc)}), "
        f"{traffic.sent} requests while rolling, {traffic.failed} failed"
    )
    if traffic.first_failure:
        saw += f" (first: {traffic.first_failure})"
    return Check(f"roll {unit.unit_id}", ok, saw, time.monotonic() - t0)


def roll_confirmed(args: argparse.Namespace, say: Console) -> bool:
    """Ask before --roll-unit changes anything (False: a dry run, the roll row says so)."""
    say.print(
        f"smoke --roll-unit {args.roll_unit} on {args.deployment}: register a copy of the unit's task definition, "
        "roll the unit to it and back (ECS UpdateService, two deployments) while requests keep flowing, then "
        "deregister the copy"
    )
    return confirmed(args, say, f"roll {args.roll_unit} to a copy of its task definition and back")


def run_smoke(args: argparse.Namespace, console: Console) -> int:
    import openai  # noqa: PLC0415 - loaded only by this command (every other command starts faster)

    check_arg("--max-tokens", args.max_tokens, Integer(1))
    base = args.url.rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise bad_arg(
            "--url",
            args.url,
            "has no scheme",
            "give the base URL with it, e.g. http://internal-alb-….elb.amazonaws.com",
        )
    say = prose_console(args, console)
    roll = bool(args.roll_unit) and roll_confirmed(args, say)  # refused (no terminal, no --yes): nothing sent
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=args.api_key, max_retries=0, timeout=args.timeout)
    seen: dict[str, Any] = {}
    checks = run_checks(client, max_tokens=args.max_tokens, seen=seen)
    expected = 6
    if roll and all(c.ok for c in checks) and len(checks) == 5:
        checks.append(roll_unit(args, client, model=seen["model"], console=say))
    elif roll:
        checks.append(Check(f"roll {args.roll_unit}", False, "not tried: a check above failed", 0.0))
    elif args.roll_unit:
        checks.append(Check(f"roll {args.roll_unit}", True, "skipped: dry run (nothing changed)", 0.0, skipped=True))
    else:
        checks.append(Check("roll a unit", True, ROLL_SKIPPED, 0.0, skipped=True))
    failed = [c.name for c in checks if not c.ok]
    passed = not failed and len(checks) >= expected
    if args.json:
        doc = {
            "url": base,
            "passed": passed,
            "checks": [
                {
                    "check": c.name,
                    "result": "SKIP" if c.skipped else "PASS" if c.ok else "FAIL",
                    "seconds": c.seconds,
                    "saw": c.saw,
                }
                for c in checks
            ],
        }
        console.print_json(json.dumps(doc))
        return EXIT_OK if passed else EXIT_FAILED
    table = Table(title=f"smoke test of {base}")
    for col in ("check", "result", "seconds", "what it saw"):
        table.add_column(col)
    for c in checks:
        result = "[yellow]SKIP[/]" if c.skipped else "[green]PASS[/]" if c.ok else "[red]FAIL[/]"
        table.add_row(c.name, result, f"{c.seconds:.2f}", c.saw)
    console.print(table)
    if not passed:
        console.print(f"[red]FAIL[/]: {', '.join(failed)}")
        return EXIT_FAILED
    console.print("PASS: every check" + (" (the unit roll skipped)" if checks[-1].skipped else ""))
    return EXIT_OK
