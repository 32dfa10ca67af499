"""The one create-only write (`beacon.create_only`): its five outcomes, against a real moto server."""

from __future__ import annotations

from typing import Any

import pytest
from beacon.create_only import Written, put_create_only
from botocore.exceptions import ClientError

from tests.support.moto_server import MotoServer

BUCKET = "beacon-create-only"


@pytest.fixture
def s3(moto_server: MotoServer) -> Any:
    client = moto_server.client("s3")
    client.create_bucket(Bucket=BUCKET)
    return client


class ReadsFail:
    """S3 whose reads are throttled: every GetObject answers 503 SlowDown."""

    def __init__(self, s3: Any) -> None:
        self.s3 = s3

    def put_object(self, **kwargs: Any) -> Any:
        return self.s3.put_object(**kwargs)

    def get_object(self, **_: Any) -> Any:
        raise ClientError({"Error": {"Code": "SlowDown", "Message": "injected"}}, "GetObject")


def test_created_then_same_bytes_then_other_bytes_are_three_outcomes(s3: Any) -> None:
    first = put_create_only(s3, bucket=BUCKET, key="k", body=b"one")
    again = put_create_only(s3, bucket=BUCKET, key="k", body=b"one")
    other = put_create_only(s3, bucket=BUCKET, key="k", body=b"two")
    assert [o.written for o in (first, again, other)] == [Written.CREATED, Written.SAME, Written.CONFLICT]
    assert first.held and again.held and not other.held and not other.retry
    assert s3.get_object(Bucket=BUCKET, Key="k")["Body"].read() == b"one", "the first bytes stay"


def test_a_read_back_that_fails_is_not_a_conflict_but_a_retry(s3: Any) -> None:
    put_create_only(s3, bucket=BUCKET, key="k", body=b"one")
    throttled = put_create_only(ReadsFail(s3), bucket=BUCKET, key="k", body=b"two")
    assert throttled.written is Written.UNCOMPARED and throttled.retry and not throttled.held
    assert isinstance(throttled.error, ClientError)


def test_without_compare_an_existing_key_is_kept_unread_and_a_refused_put_is_failed(s3: Any) -> None:
    put_create_only(s3, bucket=BUCKET, key="k", body=b"one")
    assert put_create_only(ReadsFail(s3), bucket=BUCKET, key="k", body=b"two", compare=False).written is Written.SAME
    refused = put_create_only(s3, bucket="no-such-bucket", key="k", body=b"one")
    assert refused.written is Written.FAILED and refused.retry and refused.error is not None
