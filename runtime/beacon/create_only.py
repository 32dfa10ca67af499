"""The create-only write: how Beacon puts every key that must never change once written.

A PUT with `If-None-Match: *` creates the key or answers 412. A 412 is not yet a verdict: the key may hold
these very bytes (a retry of a PUT whose answer was lost, an earlier process's upload of the same chunk) or
other bytes (another writer). Only a successful read that finds other bytes is a conflict; a read that fails
(throttled, a lost connection) says nothing about the key, and is retried like any transient error.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError


class Written(enum.Enum):
    CREATED = "created"  # this PUT created the key
    SAME = "same"  # already there, with these bytes
    CONFLICT = "conflict"  # already there, with other bytes: read back successfully
    UNCOMPARED = "uncompared"  # already there, and the read-back failed: try again later
    FAILED = "failed"  # the PUT itself failed (refused, throttled, unreachable): try again later


@dataclass(frozen=True)
class Outcome:
    written: Written
    key: str
    error: BaseException | None = None  # what failed, for FAILED and UNCOMPARED

    @property
    def held(self) -> bool:
        """S3 holds these bytes under the key."""
        return self.written in (Written.CREATED, Written.SAME)

    @property
    def retry(self) -> bool:
        """Nothing is known to be wrong: the same write may succeed later."""
        return self.written in (Written.UNCOMPARED, Written.FAILED)


def precondition_failed(error: ClientError) -> bool:
    return bool(error.response.get("Error", {}).get("Code") == "PreconditionFailed")


def put_create_only(s3: Any, *, bucket: str, key: str, body: bytes, compare: bool = True) -> Outcome:
    """Create `key` with `body` unless it exists. With `compare` False an existing key counts as SAME unread
    (an evidence file or a marker: the first copy is the one kept, whatever the second says)."""
    try:
        s3.put_object(Bucket=bucket, Key=key, Body=body, IfNoneMatch="*")
        return Outcome(Written.CREATED, key)
    except ClientError as error:
        if not precondition_failed(error):
            return Outcome(Written.FAILED, key, error)
    except (BotoCoreError, OSError) as error:
        return Outcome(Written.FAILED, key, error)
    if not compare:
        return Outcome(Written.SAME, key)
    try:
        existing = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except (ClientError, BotoCoreError, OSError) as error:
        return Outcome(Written.UNCOMPARED, key, error)
    same = hashlib.sha256(existing).digest() == hashlib.sha256(body).digest()
    return Outcome(Written.SAME if same else Written.CONFLICT, key)
