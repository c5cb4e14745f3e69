"""The API keys' secret, changed by compare-and-set: a `flotilla keys` run writes its change only onto
the version it read, so two runs at once (one creating a key, one revoking another) never undo each
other; the one that read a version already replaced reads again and re-applies its change.

Secrets Manager has no conditional PutSecretValue, but moving a staging label is one:
UpdateSecretVersionStage "RemoveFromVersionId: ... If the label is attached and you either do not
specify this parameter, or the version ID does not match, then the operation fails" (Secrets Manager
API reference). So a change is written as a new version under a label of our own (PutSecretValue with
VersionStages leaves AWSCURRENT where it is: "If you don't include VersionStages, then Secrets Manager
automatically moves the staging label AWSCURRENT to this version"), then AWSCURRENT is moved onto it
from exactly the version that was read. Moving AWSCURRENT also moves AWSPREVIOUS to that version
(same reference), which is what docs/runbooks/api-keys.md's rollback restores.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import botocore.exceptions

from contract.apikeys import KeySet, KeySetError
from ops.errors import OpsError

CURRENT = "AWSCURRENT"
PENDING = "FLOTILLA_PENDING"  # the label of a version written but not yet current
ATTEMPTS = 5  # concurrent changes in a row before giving up (each re-read sees the others' result)


@dataclass(frozen=True)
class Snapshot:
    """The keys as read, and the version they were read from (None: the secret does not exist)."""

    keys: KeySet | None
    version_id: str | None


def _code(err: botocore.exceptions.ClientError) -> str:
    return str(err.response.get("Error", {}).get("Code", ""))


def read(client: Any, name: str) -> Snapshot:
    try:
        # AWSCURRENT by name, though it is GetSecretValue's default: moto (5.2.5) answers the default
        # with the secret's first current version even after UpdateSecretVersionStage moved the label.
        answer = client.get_secret_value(SecretId=name, VersionStage=CURRENT)
    except botocore.exceptions.ClientError as err:
        if _code(err) == "ResourceNotFoundException":
            return Snapshot(None, None)
        raise
    try:
        keys = KeySet.loads(answer["SecretString"])
    except KeySetError as err:
        raise OpsError(f"secret {name} holds no key set ({err}): restore a previous version of it") from None
    return Snapshot(keys, str(answer["VersionId"]))


def _create(client: Any, name: str, keys: KeySet) -> bool:
    """True once created; False when another run created the secret first."""
    try:
        client.create_secret(
            Name=name,
            SecretString=keys.dumps(),
            ClientRequestToken=str(uuid.uuid4()),
            Description="flotilla API keys, hashed (flotilla keys)",
        )
    except botocore.exceptions.ClientError as err:
        if _code(err) == "ResourceExistsException":
            return False
        raise
    return True


def _replace(client: Any, name: str, keys: KeySet, read_version: str) -> bool:
    """True once `keys` is the current version; False when the current version is no longer
    `read_version` (another run changed the keys since they were read)."""
    version = str(uuid.uuid4())  # ClientRequestToken: the new version's id
    client.put_secret_value(
        SecretId=name, SecretString=keys.dumps(), ClientRequestToken=version, VersionStages=[PENDING]
    )
    try:
        client.update_secret_version_stage(
            SecretId=name, VersionStage=CURRENT, MoveToVersionId=version, RemoveFromVersionId=read_version
        )
    except botocore.exceptions.ClientError as err:
        if _code(err) == "InvalidParameterException":
            return False
        raise
    return True


def update(client: Any, name: str, change: Callable[[KeySet | None], KeySet]) -> KeySet:
    """Apply `change` (the keys read, None when the secret does not exist yet -> the keys to store) and
    store the result, re-reading and re-applying it when another run changed the keys in between.
    `change` may raise OpsError (a key it needs is gone): nothing is written then."""
    for _ in range(ATTEMPTS):
        snapshot = read(client, name)
        keys = change(snapshot.keys)
        if snapshot.version_id is None:
            if _create(client, name, keys):
                return keys
        elif _replace(client, name, keys, snapshot.version_id):
            return keys
    raise OpsError(
        f"secret {name} changed under this command {ATTEMPTS} times in a row (other flotilla keys runs): "
        "nothing was written; run the command again"
    )
