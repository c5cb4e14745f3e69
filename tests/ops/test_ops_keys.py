"""`flotilla keys create | list | revoke | limit` against moto's Secrets Manager, read back the way every
router reads the secret (runtime/router/access.py): a new key works, a revoked one stops within the
keys' TTL, a changed limit applies, and the key itself is printed once and stored only hashed."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from contract.apikeys import KeyEntry, KeySet, digest, new_key, secret_name
from ops import key_store
from runtime.router.access import AccessControl, SecretSource

NAME = secret_name("flotilla")
KEY_RE = re.compile(r"flt_[0-9a-f]{8}_[A-Za-z0-9_-]{43}")


def _stored(aws) -> KeySet:
    """The keys as routers read them: the AWSCURRENT version."""
    return KeySet.loads(aws.secretsmanager.get_secret_value(SecretId=NAME, VersionStage="AWSCURRENT")["SecretString"])


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
    stored = aws.secretsmanager.get_secret_value(SecretId=NAME, VersionStage="AWSCURRENT")["SecretString"]
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


def test_a_secret_scheduled_for_deletion_ends_its_keys_at_the_next_read_instead_of_keeping_them(aws, run_cli):
    """Deleting the secret with a recovery window (teardown, or by hand) schedules it for deletion;
    GetSecretValue then answers InvalidRequestException ("The secret is scheduled for deletion",
    Secrets Manager API reference). That is the keys' end, not a passing fault: the router must not
    keep the last set in force for the whole recovery window."""
    kid, key = _create(run_cli, "--name", "shop-frontend")
    access = AccessControl(read=SecretSource(NAME, client=aws.secretsmanager).read, ttl_s=60, name=NAME)

    async def scenario():
        await access.refresh()
        before = access.authenticate(f"Bearer {key}")
        aws.secretsmanager.delete_secret(SecretId=NAME, RecoveryWindowInDays=7)
        await access.refresh()
        return before, access.authenticate(f"Bearer {key}"), access.read_errors

    before, after, errors = asyncio.run(asyncio.wait_for(scenario(), 10))
    assert before[0] == kid
    assert after == "invalid" and errors == 0


def test_a_failed_read_keeps_the_last_keys_in_force():
    """A throttled or unreachable Secrets Manager must not lock every client out: the last keys stay."""

    kid, key = new_key()
    reads = iter([KeySet({kid: KeyEntry(name="a", sha256=digest(key))}).dumps()])

    def read() -> str:
        try:
            return next(reads)
        except StopIteration:
            raise ConnectionError("endpoint unreachable") from None

    access = AccessControl(read=read, ttl_s=60, name="test")

    async def scenario():
        await access.refresh()
        await access.refresh()
        return access.authenticate(f"Bearer {key}"), access.read_errors

    found, errors = asyncio.run(scenario())
    assert found[0] == kid and errors == 1


def test_list_shows_every_key_without_the_key_and_limit_changes_one_key_only(aws, run_cli):
    a_id, a_key = _create(run_cli, "--name", "assistant", "--requests-per-s", "20", "--tokens-per-min", "90000")
    b_id, _ = _create(run_cli, "--name", "nightly", "--priority", "batch")
    code, out = run_cli("keys", "list")
    assert code == 0 and a_id in out and b_id in out and "assistant" in out and "batch" in out
    assert a_key not in out
    code, out = run_cli("keys", "limit", a_id, "--requests-per-s", "50", "--yes")
    assert code == 0, out
    keys = KeySet.loads(
        aws.secretsmanager.get_secret_value(SecretId=NAME, VersionStage="AWSCURRENT")["SecretString"]
    ).keys
    assert keys[a_id].requests_per_s == 50 and keys[a_id].tokens_per_min == 90000  # left out: kept
    assert keys[b_id].priority == "batch" and keys[b_id].requests_per_s is None
    code, out = run_cli("keys", "limit", a_id, "--tokens-per-min", "none", "--yes")
    assert code == 0
    keys = KeySet.loads(
        aws.secretsmanager.get_secret_value(SecretId=NAME, VersionStage="AWSCURRENT")["SecretString"]
    ).keys
    assert keys[a_id].tokens_per_min is None and keys[a_id].requests_per_s == 50


def test_revoke_and_limit_are_dry_runs_or_refused_without_confirmation_and_unknown_ids_are_named(aws, run_cli):
    kid, key = _create(run_cli, "--name", "x")
    code, out = run_cli("keys", "revoke", kid, "--dry-run")
    assert code == 0 and "dry run: nothing changed" in out
    code, out = run_cli("keys", "revoke", kid)
    assert code == 1 and f"refusing to revoke key {kid}" in out
    assert KeySet.loads(
        aws.secretsmanager.get_secret_value(SecretId=NAME, VersionStage="AWSCURRENT")["SecretString"]
    ).lookup(key)
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


def race_at(monkeypatch, read_number: int, other_run) -> None:
    """Run `other_run` (another `flotilla keys` run, whole) right after this run's read number
    `read_number` of the secret, so it lands between that read and this run's write."""
    real_read, reads = key_store.read, []

    def read_then_race(client, name):
        snapshot = real_read(client, name)
        reads.append(name)
        if len(reads) == read_number:
            monkeypatch.setattr(key_store, "read", real_read)  # the other run reads undisturbed
            other_run()
        return snapshot

    monkeypatch.setattr(key_store, "read", read_then_race)


def test_a_key_created_while_another_run_revokes_one_does_not_bring_the_revoked_key_back(aws, run_cli, monkeypatch):
    """`keys create` reads the keys, another `keys revoke` lands, then create writes: written blindly,
    its copy would restore the revoked key. Written onto the version it read (UpdateSecretVersionStage
    with RemoveFromVersionId fails once AWSCURRENT moved), it re-reads and keeps the revocation."""
    revoked, _ = _create(run_cli, "--name", "leaked")
    # Read 1 shows where the key goes (before confirmation); read 2 is the one the write builds on.
    race_at(monkeypatch, 2, lambda: run_cli("keys", "revoke", revoked, "--yes"))
    created, _ = _create(run_cli, "--name", "new-client")
    keys = _stored(aws).keys
    assert revoked not in keys and created in keys
    versions = aws.secretsmanager.list_secret_version_ids(SecretId=NAME)["Versions"]
    assert len([v for v in versions if "AWSCURRENT" in v.get("VersionStages", [])]) == 1


def test_two_first_creates_at_once_keep_both_keys(aws, run_cli, monkeypatch):
    """Both runs see no secret; the second CreateSecret fails (ResourceExistsException), re-reads
    the secret the first created and adds its key to it."""
    first = []
    race_at(monkeypatch, 2, lambda: first.append(_create(run_cli, "--name", "first")[0]))
    second, _ = _create(run_cli, "--name", "second")
    assert set(_stored(aws).keys) == {first[0], second}


def test_a_limit_change_racing_a_revoke_of_the_same_key_is_refused_and_writes_nothing(aws, run_cli, monkeypatch):
    """`keys limit` shows the key (read 1), is confirmed, re-reads to write (read 2); a revoke lands
    after that read: the limit must not write the key back."""
    kid, _ = _create(run_cli, "--name", "x")
    race_at(monkeypatch, 2, lambda: run_cli("keys", "revoke", kid, "--yes"))
    code, out = run_cli("keys", "limit", kid, "--requests-per-s", "5", "--yes")
    assert code == 1 and "another `flotilla keys` run removed it" in out
    assert kid not in _stored(aws).keys
