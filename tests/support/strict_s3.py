"""The bucket policy, applied as S3 applies it, to what moto lets through.

moto ignores every condition of a bucket policy: a job that forgot `If-None-Match` on a history key
would pass every test and be refused by real S3. The gate evaluates the synthesized bucket policy
(tests/support/policy_eval.py) for each object write, with the request's own headers as context,
and answers an explicit Deny with S3's 403, before moto ever sees the request. `aws:SecureTransport`
is whether the request itself came over TLS: the caller (the fault proxy) says how it arrived.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote, urlparse

from beacon_ops.templates import Template
from config import names
from tests.support.policy_eval import Decision, Deployment, PolicyDoc, Request, evaluate

OBJECT_WRITES = {"PUT"}  # PutObject and CompleteMultipart's parts; the policy's Deny is on s3:PutObject


@dataclass
class BucketPolicyGate:
    bucket: str  # the bucket the tests use (moto's), standing for the synthesized one
    policy_bucket_arn: str
    writer_arn: str
    policies: list[PolicyDoc]
    refused: int = 0

    @classmethod
    def of(cls, templates: Mapping[str, Template], team: str, bucket: str) -> BucketPolicyGate:
        deployment = Deployment(templates)
        stack = names.stack_name(team, "artifacts")
        bucket_arn = deployment.arn(stack, deployment.find(stack, "AWS::S3::Bucket", "ArtifactStoreBucket"))
        writer = deployment.arn(stack, deployment.find(stack, "AWS::IAM::Role", "ArtifactStoreWriterRole"))
        return cls(bucket, bucket_arn, writer, deployment.resource_policies(bucket_arn))

    def decision(
        self, method: str, path: str, headers: Mapping[str, str], *, secure_transport: bool
    ) -> Decision | None:
        """The bucket policy's decision on one request, or None when it is no object write to this bucket."""
        parsed = urlparse(path)
        bucket, _, key = unquote(parsed.path).lstrip("/").partition("/")
        if method not in OBJECT_WRITES or bucket != self.bucket or not key:
            return None
        query = parsed.query
        part_of_multipart = "partNumber=" in query and "uploadId=" in query
        context: dict[str, object] = {
            "aws:SecureTransport": secure_transport,
            "s3:ObjectCreationOperation": not part_of_multipart,
        }
        lowered = {k.lower(): v for k, v in headers.items()}
        if "if-none-match" in lowered:
            context["s3:if-none-match"] = lowered["if-none-match"]
        if "if-match" in lowered:
            context["s3:if-match"] = lowered["if-match"]
        request = Request("s3:PutObject", f"{self.policy_bucket_arn}/{key}", self.writer_arn, context)
        return evaluate(self.policies, request)

    def refuses(self, method: str, path: str, headers: Mapping[str, str], *, secure_transport: bool) -> bool:
        if self.decision(method, path, headers, secure_transport=secure_transport) is Decision.EXPLICIT_DENY:
            self.refused += 1
            return True
        return False
