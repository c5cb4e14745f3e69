"""`flotilla keys create | list | revoke | limit`: the API keys every router checks.

Keys live hashed in the deployment's Secrets Manager secret (contract/apikeys.py); every router
re-reads it every 30 s (--api-keys-ttl), so a new key, a revocation or a changed limit takes effect
without a redeploy. A new key is printed once, alone on stdout: only its SHA-256 is stored.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from datetime import UTC, datetime

from rich.console import Console
from rich.table import Table

from contract.apikeys import (
    API_KEYS_TTL_S,
    MAX_REQUESTS_PER_S,
    MAX_TOKENS_PER_MIN,
    PRIORITIES,
    KeyEntry,
    KeySet,
    KeySetError,
    digest,
    new_key,
    secret_name,
)
from contract.declare import Integer, Number
from ops import key_store
from ops.aws import Aws, clients_for
from ops.commands import Subparsers
from ops.commands.common import add_confirm_options, add_json_option, confirmed, stderr_console
from ops.errors import FlagType, OpsError, UsageError

NO_LIMIT = "or none: no limit"


class _Keep:
    """Default of `keys limit` options: a limit left out keeps its value (`none` clears it)."""


KEEP = _Keep()


def _add_limit_options(p: argparse.ArgumentParser, *, default: object = None) -> None:
    p.add_argument(
        "--requests-per-s",
        default=default,
        type=FlagType("--requests-per-s", Number(0, MAX_REQUESTS_PER_S, NO_LIMIT, above=True), none=True),
        metavar="R",
        help="requests per second the key may make, fleet-wide (none: no limit)",
    )
    p.add_argument(
        "--tokens-per-min",
        default=default,
        type=FlagType("--tokens-per-min", Integer(1, MAX_TOKENS_PER_MIN, NO_LIMIT), none=True),
        metavar="T",
        help="prompt + completion tokens per minute, counted as requested (none: no limit)",
    )
    p.add_argument("--priority", choices=PRIORITIES, help="batch keys are shed first when the fleet is busy")


def add_parser(sub: Subparsers) -> list[argparse.ArgumentParser]:
    p = sub.add_parser(
        "keys",
        help="API keys: `keys create`, `keys list`, `keys revoke`, `keys limit`",
        description="The API keys every router checks (Secrets Manager secret flotilla/<deployment>/api-keys). "
        f"Routers apply a change within about {API_KEYS_TTL_S} s; no redeploy.",
    )
    psub = p.add_subparsers(dest="keys_command", required=True, metavar="SUBCOMMAND")
    c = psub.add_parser(
        "create",
        help="issue a key (printed once)",
        description="Issue a key. Only the key goes to stdout (`export FLOTILLA_API_KEY=$(flotilla keys create "
        "--name NAME --yes)`), printed once; everything else goes to stderr. Every router accepts it within "
        f"about {API_KEYS_TTL_S} s. Dry run unless confirmed.",
    )
    c.add_argument("--name", required=True, help="who holds the key (a team or an application)")
    _add_limit_options(c)
    add_confirm_options(c)
    add_json_option(c, "the key with its id and limits")
    c.set_defaults(handler=run_create, data_on_stdout=True)
    s = psub.add_parser("list", help="the keys in force", description="Every key: id, holder, class, limits.")
    add_json_option(s, "the keys (never the keys themselves: only their ids)")
    s.set_defaults(handler=run_list)
    r = psub.add_parser("revoke", help="revoke a key", description="Revoke a key. Dry run unless confirmed.")
    r.add_argument("key_id", help="the key's id (the 8 hex digits after flt_, as `keys list` shows)")
    add_confirm_options(r)
    r.set_defaults(handler=run_revoke)
    m = psub.add_parser(
        "limit",
        help="change a key's limits or class",
        description="Change a key's limits or priority class (e.g. raise a limit during an incident). "
        "Options left out keep their value. Dry run unless confirmed.",
    )
    m.add_argument("key_id", help="the key's id")
    _add_limit_options(m, default=KEEP)
    add_confirm_options(m)
    m.set_defaults(handler=run_limit)
    return [c, s, r, m]


def read_keys(aws: Aws, name: str) -> KeySet | None:
    """The key set in the secret, None when the secret does not exist yet."""
    return key_store.read(aws.secretsmanager, name).keys


def describe(entry: KeyEntry) -> str:
    rps = f"{entry.requests_per_s:g} requests/s" if entry.requests_per_s is not None else "no requests/s limit"
    tpm = f"{entry.tokens_per_min} tokens/min" if entry.tokens_per_min is not None else "no tokens/min limit"
    return f"{entry.priority}, {rps}, {tpm}"


def _entry(base: KeyEntry, args: argparse.Namespace) -> KeyEntry:
    rps, tpm = args.requests_per_s, args.tokens_per_min
    try:
        return KeyEntry(
            name=base.name,
            sha256=base.sha256,
            priority=args.priority or base.priority,
            requests_per_s=base.requests_per_s if isinstance(rps, _Keep) else rps,
            tokens_per_min=base.tokens_per_min if isinstance(tpm, _Keep) else tpm,
            created=base.created,
        )
    except KeySetError as err:
        raise UsageError(f"keys: {err}") from None


def run_create(args: argparse.Namespace, console: Console) -> int:
    say = stderr_console()  # stdout carries the key alone, for `FLOTILLA_API_KEY=$(flotilla keys create ...)`
    aws = clients_for(args)
    name = secret_name(args.deployment)
    current = read_keys(aws, name)
    kid, key = new_key()
    entry = KeyEntry(
        name=args.name,
        sha256=digest(key),
        priority=args.priority or "interactive",
        requests_per_s=args.requests_per_s,
        tokens_per_min=args.tokens_per_min,
        created=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    where = f"{name} (a new secret)" if current is None else name
    say.print(f"keys create on {args.deployment}: a key for {args.name} ({describe(entry)}) in {where}")
    if not confirmed(args, say, f"issue a key for {args.name}"):
        return 0
    # Written onto the version read at write time, re-read if another `keys` run changed it (ops/key_store.py).
    key_store.update(aws.secretsmanager, name, lambda latest: KeySet({**(latest.keys if latest else {}), kid: entry}))
    say.print(
        f"key {kid} for {args.name}: routers accept it within {API_KEYS_TTL_S} s; shown once, only its hash is kept"
    )
    if args.json:
        console.print_json(json.dumps({"id": kid, "key": key, "secret": name, **_entry_dict(entry)}))
    else:
        console.print(key, soft_wrap=True, markup=False, highlight=False)
    return 0


def _entry_dict(e: KeyEntry) -> dict[str, object]:
    return {
        "name": e.name,
        "priority": e.priority,
        "requests_per_s": e.requests_per_s,
        "tokens_per_min": e.tokens_per_min,
        "created": e.created,
    }


def run_list(args: argparse.Namespace, console: Console) -> int:
    aws = clients_for(args)
    name = secret_name(args.deployment)
    keys = read_keys(aws, name)
    entries = sorted(keys.keys.items(), key=lambda kv: kv[1].created) if keys else []
    if args.json:
        console.print_json(json.dumps({"secret": name, "keys": [{"id": k, **_entry_dict(e)} for k, e in entries]}))
        return 0
    if not entries:
        console.print(f"no API keys in {name}: every request to the routers gets 401 (flotilla keys create)")
        return 0
    table = Table("id", "name", "priority", "requests/s", "tokens/min", "created", title=name)
    for kid, e in entries:
        rps = f"{e.requests_per_s:g}" if e.requests_per_s is not None else "-"
        tpm = str(e.tokens_per_min) if e.tokens_per_min is not None else "-"
        table.add_row(kid, e.name, e.priority, rps, tpm, e.created)
    console.print(table)
    return 0


def _existing(aws: Aws, name: str, kid: str) -> tuple[KeySet, KeyEntry]:
    keys = read_keys(aws, name)
    if keys is None or kid not in keys.keys:
        raise OpsError(f"no key {kid!r} in {name}: `flotilla keys list` shows the ids")
    return keys, keys.keys[kid]


def _without(current: KeySet | None, name: str, kid: str) -> KeySet:
    """The keys read at write time less `kid` (gone meanwhile: refused, nothing written)."""
    if current is None or kid not in current.keys:
        raise OpsError(f"no key {kid!r} in {name} any more: another `flotilla keys` run removed it")
    return KeySet({k: e for k, e in current.keys.items() if k != kid})


def _with(current: KeySet | None, name: str, kid: str, change: Callable[[KeyEntry], KeyEntry]) -> KeySet:
    """The keys read at write time with `kid`'s entry changed (gone meanwhile: refused)."""
    if current is None or kid not in current.keys:
        raise OpsError(f"no key {kid!r} in {name} any more: another `flotilla keys` run removed it")
    return KeySet({**current.keys, kid: change(current.keys[kid])})


def run_revoke(args: argparse.Namespace, console: Console) -> int:
    aws = clients_for(args)
    name = secret_name(args.deployment)
    _, entry = _existing(aws, name, args.key_id)
    console.print(
        f"keys revoke on {args.deployment}: key {args.key_id} of {entry.name} ({describe(entry)}); every "
        f"router refuses it (401) within about {API_KEYS_TTL_S} s"
    )
    if not confirmed(args, console, f"revoke key {args.key_id}"):
        return 0
    key_store.update(aws.secretsmanager, name, lambda current: _without(current, name, args.key_id))
    console.print(f"key {args.key_id}: revoked")
    return 0


def run_limit(args: argparse.Namespace, console: Console) -> int:
    if isinstance(args.requests_per_s, _Keep) and isinstance(args.tokens_per_min, _Keep) and args.priority is None:
        raise UsageError("keys limit: give at least one of --requests-per-s, --tokens-per-min, --priority")
    aws = clients_for(args)
    name = secret_name(args.deployment)
    _, entry = _existing(aws, name, args.key_id)
    after = _entry(entry, args)
    console.print(f"keys limit on {args.deployment}: key {args.key_id} of {entry.name}")
    console.print(f"  now:   {describe(entry)}")
    console.print(f"  after: {describe(after)}")
    console.print(f"  every router applies it within about {API_KEYS_TTL_S} s")
    if not confirmed(args, console, f"change the limits of key {args.key_id}"):
        return 0
    stored = key_store.update(
        aws.secretsmanager, name, lambda current: _with(current, name, args.key_id, lambda e: _entry(e, args))
    )
    console.print(f"key {args.key_id}: {describe(stored.keys[args.key_id])}")
    return 0
