"""The bucket policy, applied as S3 applies it, to what moto lets through.

moto ignores every condition of a bucket policy: a job that forgot `If-None-Match` on a history key
would pass every test and be refused by real S3. The gate evaluates the synthesized bucket policy
(tests/support/policy_eval.py) for each object write, with the request's own headers as context,
and answers an explicit Deny with S3's 403, before moto ever sees the request. `aws:SecureTransport`
is whether the request itself came over TLS: the caller (the fault proxy) says how it arrived.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlparse

from botocore.exceptions import ClientError

from beacon_ops.templates import Template
from config import names
from tests.support.policy_eval import REGION, Decision, Deployment, PolicyDoc, Request, evaluate

# What S3 authorizes as s3:PutObject: PutObject, CopyObject and UploadPart (PUT), CreateMultipartUpload and
# CompleteMultipartUpload (POST). Only PutObject, CopyObject and CompleteMultipartUpload create an object
# (s3:ObjectCreationOperation), and only they carry If-None-Match.
OBJECT_WRITES = {"PUT", "POST"}


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
        arguments = {part.split("=", 1)[0] for part in query.split("&") if part}
        if method == "POST" and not arguments & {"uploads", "uploadId"}:
            return None  # DeleteObjects and the like: not a write of one object
        # UploadPart and CreateMultipartUpload take no conditional header and create nothing themselves
        creates = not ("uploads" in arguments or ("partNumber" in arguments and "uploadId" in arguments))
        context: dict[str, object] = {"aws:SecureTransport": secure_transport, "s3:ObjectCreationOperation": creates}
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


# What a reading of a run calls, as IAM names it: (action, whether the request names an object).
READ_ACTIONS = {
    "GetObject": "s3:GetObject",
    "HeadObject": "s3:GetObject",
    "ListObjectsV2": "s3:ListBucket",
    "ListObjects": "s3:ListBucket",
}


@dataclass
class SessionGate:
    """A role session's S3 reads, decided as AWS would: the synthesized role's policies, the session policy
    it was taken with (AssumeRole's `Policy`, which moto ignores), the bucket policy and the bucket key's
    policy. A refused call fails with S3's AccessDenied, and is kept in `refused` for the test to show."""

    deployment: Deployment
    role_arn: str
    session_policy: Mapping[str, Any]
    bucket: str  # moto's, standing for the synthesized one
    policy_bucket_arn: str
    key_arn: str
    refused: list[str] = field(default_factory=list)
    allowed: list[str] = field(default_factory=list)

    @classmethod
    def of(
        cls, templates: Mapping[str, Template], team: str, bucket: str, role_prefix: str, policy: str
    ) -> SessionGate:
        deployment = Deployment(templates)
        stack = names.stack_name(team, "artifacts")
        bucket_arn = deployment.arn(stack, deployment.find(stack, "AWS::S3::Bucket", "ArtifactStoreBucket"))
        # The session policy names moto's bucket; AWS would see the deployed one.
        session_policy = json.loads(policy.replace(f":s3:::{bucket}", f":s3:::{bucket_arn.split(':::', 1)[1]}"))
        return cls(
            deployment,
            deployment.arn(stack, deployment.find(stack, "AWS::IAM::Role", role_prefix)),
            session_policy,
            bucket,
            bucket_arn,
            deployment.arn(stack, deployment.find(stack, "AWS::KMS::Key", "ArtifactStoreKey")),
        )

    def requests(self, operation: str, params: Mapping[str, Any]) -> list[Request]:
        tls = {"aws:SecureTransport": True}
        if operation not in READ_ACTIONS or params.get("Bucket") != self.bucket:  # no reading of a run: refused
            return [Request(f"s3:{operation}", self.policy_bucket_arn, self.role_arn, tls)]
        if READ_ACTIONS[operation] == "s3:ListBucket":
            context = {**tls, "s3:prefix": params.get("Prefix", "")}
            return [Request("s3:ListBucket", self.policy_bucket_arn, self.role_arn, context)]
        via_s3 = {**tls, "kms:ViaService": f"s3.{REGION}.amazonaws.com"}
        return [
            Request("s3:GetObject", f"{self.policy_bucket_arn}/{params['Key']}", self.role_arn, tls),
            Request("kms:Decrypt", self.key_arn, self.role_arn, via_s3),  # every object is under the bucket key
        ]

    def install(self, client: Any) -> Any:
        def decide(model: Any, params: Mapping[str, Any], **_: Any) -> None:
            for request in self.requests(model.name, params):
                decision = self.deployment.decide(request, self.session_policy).decision
                line = f"{request.action} {request.resource} {dict(request.context)}"
                if decision is not Decision.ALLOW:
                    self.refused.append(line)
                    error = {"Error": {"Code": "AccessDenied", "Message": f"{decision}: {line}"}}
                    raise ClientError(error, model.name)
                self.allowed.append(line)

        client.meta.events.register("before-parameter-build.s3", decide)
        return client
