"""`flotilla keys create | list | revoke | limit` against moto's Secrets Manager, read back the way every
router reads the secret (runtime/router/access.py): a new key works, a revoked one stops within the
keys' TTL, a changed limit applies, and the key itself is printed once and stored only hashed."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from contract.apikeys import KeySet, secret_name
from runtime.router.access import AccessControl, SecretSource

NAME = secret_name("flotilla")
KEY_RE = re.compile(r"flt_[0-9a-f]{8}_[A-Za-z0-9_-]{43}")


def _create(run_cli, *argv: str) -> tuple[str, str]:
    code, out = run_cli("keys", "create", *argv, "--yes")
    assert code == 0, out
    key = KEY_RE.search(out).group(0)
    return key.split("_")[1], key


def test_create_prints_the_key_alone_on_stdout_and_everything_else_on_stderr(aws, run_cli_err):
    code, out, err = run_cli_err("keys", "create", "--name", "shop-frontend", "--yes")
    assert code == 0
    assert KEY_RE.fullmatch(out.rstrip("\n")) and out.count("\n") == 1  # `X=$(flotilla keys create ...)` works
    kid = out.split("_")[1]
    assert f"key {kid} for shop-frontend" in " ".join(err.split()) and "flt_" not in err
    code, out, err = run_cli_err("keys", "create", "--name", "batch-jobs", "--priority", "batch", "--yes", "--json")
    doc = json.loads(out)
    assert code == 0 and KEY_RE.fullmatch(doc["key"]) and doc["id"] == doc["key"].split("_")[1]
    assert doc["priority"] == "batch" and doc["secret"] == NAME
    code, out, _ = run_cli_err("keys", "list", "--json")
    listed = json.loads(out)
    assert {k["name"] for k in listed["keys"]} == {"shop-frontend", "batch-jobs"} and "flt_" not in out


def test_create_without_confirmation_issues_no_key_and_says_why_on_stderr(aws, run_cli_err):
    code, out, err = run_cli_err("keys", "create", "--name", "x")  # stdin is not a terminal
    assert (code, out) == (1, "") and "refusing to issue a key for x" in " ".join(err.split())
    code, out, err = run_cli_err("keys", "create", "--name", "x", "--dry-run")
    assert (code, out) == (0, "") and "dry run: nothing changed" in err
    with pytest.raises(aws.secretsmanager.exceptions.ResourceNotFoundException):
        aws.secretsmanager.get_secret_value(SecretId=NAME)


def test_a_created_key_works_and_a_revoked_one_is_refused_by_a_router_within_the_ttl(aws, run_cli):
    kid, key = _create(run_cli, "--name", "shop-frontend")
    stored = aws.secretsmanager.get_secret_value(SecretId=NAME)["SecretString"]
    assert key not in stored  # only the hash is kept
    access = AccessControl(read=SecretSource(NAME, client=aws.secretsmanager).read, ttl_s=0.05, name=NAME)

    async def scenario():
        await access.start()  # reads now, then every TTL in the background
        try:
            before = access.authenticate(f"Bearer {key}")
            code, out = run_cli("keys", "revoke", kid, "--yes")
            assert code == 0 and f"key {kid}: revoked" in out
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 2.0
            while access.authenticate(f"Bearer {key}") != "invalid":
                assert loop.time() < deadline, "the revoked key still works after 40 TTLs"
                await asyncio.sleep(0.01)
            return before
        finally:
            await access.close()

    before = asyncio.run(asyncio.wait_for(scenario(), 10))
    assert before[0] == kid and before[1].name == "shop-frontend"
    code, out = run_cli("keys", "list")
    assert code == 0 and "no API keys" in out


def test_list_shows_every_key_without_the_key_and_limit_changes_one_key_only(aws, run_cli):
    a_id, a_key = _create(run_cli, "--name", "assistant", "--requests-per-s", "20", "--tokens-per-min", "90000")
    b_id, _ = _create(run_cli, "--name", "nightly", "--priority", "batch")
    code, out = run_cli("keys", "list")
    assert code == 0 and a_id in out and b_id in out and "assistant" in out and "batch" in out
    assert a_key not in out
    code, out = run_cli("keys", "limit", a_id, "--requests-per-s", "50", "--yes")
    assert code == 0, out
    keys = KeySet.loads(aws.secretsmanager.get_secret_value(SecretId=NAME)["SecretString"]).keys
    assert keys[a_id].requests_per_s == 50 and keys[a_id].tokens_per_min == 90000  # left out: kept
    assert keys[b_id].priority == "batch" and keys[b_id].requests_per_s is None
    code, out = run_cli("keys", "limit", a_id, "--tokens-per-min", "none", "--yes")
    assert code == 0
    keys = KeySet.loads(aws.secretsmanager.get_secret_value(SecretId=NAME)["SecretString"]).keys
    assert keys[a_id].tokens_per_min is None and keys[a_id].requests_per_s == 50


def test_revoke_and_limit_are_dry_runs_or_refused_without_confirmation_and_unknown_ids_are_named(aws, run_cli):
    kid, key = _create(run_cli, "--name", "x")
    code, out = run_cli("keys", "revoke", kid, "--dry-run")
    assert code == 0 and "dry run: nothing changed" in out
    code, out = run_cli("keys", "revoke", kid)
    assert code == 1 and f"refusing to revoke key {kid}" in out
    assert KeySet.loads(aws.secretsmanager.get_secret_value(SecretId=NAME)["SecretString"]).lookup(key)
    code, out = run_cli("keys", "revoke", "deadbeef", "--yes")
    assert code == 1 and "no key 'deadbeef'" in out and "keys list" in out
    code, out = run_cli("keys", "limit", kid, "--yes")
    assert code == 2 and "--requests-per-s, --tokens-per-min, --priority" in out


@pytest.mark.parametrize("argv", [["--requests-per-s", "0"], ["--tokens-per-min", "1.5"], ["--priority", "vip"]])
def test_bad_limits_are_refused_by_the_parser(aws, run_cli, capsys, argv):
    with pytest.raises(SystemExit) as exc:
        run_cli("keys", "create", "--name", "x", *argv)
    assert exc.value.code == 2
    assert argv[0] in capsys.readouterr().err
