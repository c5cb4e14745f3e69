"""`flotilla smoke`: real requests through a fleet's front door with the official `openai` client,
checked, and a pass/fail table of what was seen. Run it against a staging or new fleet's ALB URL
(the Front stack's `Url` output) or against `make local`.

Each check is one request a client would make: list the models; a chat completion, whole and
streamed; a legacy completion; and a request the API must refuse with OpenAI's error shape. The
client retries nothing (max_retries=0) and every request has a timeout, so a failing fleet fails
the smoke test in bounded time instead of hiding behind retries.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from ops.commands import Subparsers
from ops.errors import EXIT_FAILED, EXIT_OK, bad_arg

PROMPT = "Name three primary colours."
API_KEY_ENV = "FLOTILLA_API_KEY"


@dataclass
class Check:
    name: str
    ok: bool
    saw: str
    seconds: float


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value <= 600:
        raise argparse.ArgumentTypeError(f"{value:g} is out of range: use more than 0 and at most 600 seconds")
    return value


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
        "--timeout", type=_positive, default=60.0, metavar="SECONDS", help="per request; default %(default)s"
    )
    p.set_defaults(handler=run_smoke)
    return [p]


def _timed(name: str, fn: Callable[[], tuple[bool, str]]) -> Check:
    t0 = time.monotonic()
    try:
        ok, saw = fn()
    except Exception as exc:  # noqa: BLE001 - every failure is a failed check with what was seen
        ok, saw = False, f"{type(exc).__name__}: {str(exc)[:200]}"
    return Check(name, ok, saw, time.monotonic() - t0)


def run_checks(client: Any, *, max_tokens: int) -> list[Check]:
    """The checks in order; a later one uses what an earlier one learned (the model name)."""
    import openai  # noqa: PLC0415 - loaded only by this command (every other command starts faster)

    seen: dict[str, Any] = {}

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


def run_smoke(args: argparse.Namespace, console: Console) -> int:
    import openai  # noqa: PLC0415 - loaded only by this command (every other command starts faster)

    if args.max_tokens < 1:
        raise bad_arg("--max-tokens", args.max_tokens, "is out of range", "give at least 1")
    base = args.url.rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise bad_arg(
            "--url",
            args.url,
            "has no scheme",
            "give the base URL with it, e.g. http://internal-alb-….elb.amazonaws.com",
        )
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=args.api_key, max_retries=0, timeout=args.timeout)
    checks = run_checks(client, max_tokens=args.max_tokens)
    table = Table(title=f"smoke test of {base}")
    for col in ("check", "result", "seconds", "what it saw"):
        table.add_column(col)
    for c in checks:
        table.add_row(c.name, "[green]PASS[/]" if c.ok else "[red]FAIL[/]", f"{c.seconds:.2f}", c.saw)
    console.print(table)
    failed = [c.name for c in checks if not c.ok]
    if failed or len(checks) < 5:
        console.print(f"[red]FAIL[/]: {', '.join(failed)}")
        return EXIT_FAILED
    console.print("PASS: every check")
    return EXIT_OK
