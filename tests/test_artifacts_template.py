"""The artifact store as synthesized: every property the foundation issue lists, negatives included."""

from __future__ import annotations

from typing import Any

import pytest
from aws_cdk.assertions import Match, Template

from config import names
from tests.support.synth import Synthesized

STACK = "beacon-demo-artifacts"


@pytest.fixture(scope="module")
def template(demo: Synthesized) -> Template:
    return demo.assertions(STACK)


def statements(demo: Synthesized, resource_type: str, logical_prefix: str) -> list[dict[str, Any]]:
    _, resource = demo.template("artifacts").one_of_type(resource_type, logical_id_prefix=logical_prefix)
    return list(resource["Properties"]["PolicyDocument"]["Statement"])


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def test_bucket_is_versioned_kms_encrypted_private_and_logged(template: Template) -> None:
    template.has_resource(
        "AWS::S3::Bucket",
        {
            "Properties": {
                "VersioningConfiguration": {"Status": "Enabled"},
                "BucketEncryption": {
                    "ServerSideEncryptionConfiguration": [
                        {
                            "BucketKeyEnabled": True,
                            "ServerSideEncryptionByDefault": {
                                "SSEAlgorithm": "aws:kms",
                                "KMSMasterKeyID": {"Fn::GetAtt": [Match.string_like_regexp("ArtifactStoreKey"), "Arn"]},
                            },
                        }
                    ]
                },
                "PublicAccessBlockConfiguration": {
                    "BlockPublicAcls": True,
                    "BlockPublicPolicy": True,
                    "IgnorePublicAcls": True,
                    "RestrictPublicBuckets": True,
                },
                "OwnershipControls": {"Rules": [{"ObjectOwnership": "BucketOwnerEnforced"}]},
                "LoggingConfiguration": {
                    "DestinationBucketName": {"Ref": Match.string_like_regexp("ArtifactStoreAccessLogs")},
                },
            },
            "DeletionPolicy": "Retain",
            "UpdateReplacePolicy": "Retain",
        },
    )


def test_lifecycle_expires_noncurrent_versions_after_configured_days_and_aborts_multipart(
    template: Template, demo: Synthesized
) -> None:
    template.has_resource_properties(
        "AWS::S3::Bucket",
        {
            "LifecycleConfiguration": {
                "Rules": [
                    Match.object_like(
                        {
                            "Status": "Enabled",
                            "NoncurrentVersionExpiration": {
                                "NoncurrentDays": demo.config.artifacts.noncurrent_version_retention_days
                            },
                            "AbortIncompleteMultipartUpload": {
                                "DaysAfterInitiation": demo.config.artifacts.abort_incomplete_multipart_days
                            },
                        }
                    )
                ]
            }
        },
    )


def test_kms_key_rotates_and_is_retained(template: Template) -> None:
    template.has_resource("AWS::KMS::Key", {"Properties": {"EnableKeyRotation": True}, "DeletionPolicy": "Retain"})


def test_both_buckets_deny_plain_http(demo: Synthesized) -> None:
    for _, policy in demo.template("artifacts").of_type("AWS::S3::BucketPolicy").items():
        tls = [s for s in policy["Properties"]["PolicyDocument"]["Statement"] if "aws:SecureTransport" in str(s)]
        assert tls == [
            {
                "Action": "s3:*",
                "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                "Effect": "Deny",
                "Principal": {"AWS": "*"},
                "Resource": tls[0]["Resource"],
            }
        ]


def test_bucket_policy_refuses_any_history_write_that_is_not_a_conditional_create(demo: Synthesized) -> None:
    statement = next(
        s
        for s in statements(demo, "AWS::S3::BucketPolicy", "ArtifactStoreBucketPolicy")
        if s.get("Sid") == "HistoryIsCreateOnly"
    )
    assert statement["Effect"] == "Deny"
    assert statement["Principal"] == {"AWS": "*"}
    assert statement["Action"] == "s3:PutObject"
    assert statement["Condition"] == {
        "StringNotEquals": {"s3:if-none-match": "*"},
        "Bool": {"s3:ObjectCreationOperation": "true"},  # exempts multipart parts, which take no header
    }
    # Exemptions, not protected prefixes: IAM's * crosses '/' (see test_policies_as_aws_evaluates.py).
    suffixes = sorted(r["Fn::Join"][1][1] for r in statement["NotResource"])
    assert suffixes == [
        "/experiments/*/*/checkpoints/*",
        "/experiments/*/*/sagemaker-output/*",  # what SageMaker uploads at a job's end, with no header
        "/experiments/*/*/sagemaker-volume/*",
        "/experiments/*/*/status/*",
    ]
    assert "Resource" not in statement


def test_bucket_policy_denies_the_writer_every_delete(demo: Synthesized) -> None:
    statement = next(
        s
        for s in statements(demo, "AWS::S3::BucketPolicy", "ArtifactStoreBucketPolicy")
        if s.get("Sid") == "WriterNeverDeletes"
    )
    assert statement["Effect"] == "Deny"
    assert sorted(statement["Action"]) == ["s3:DeleteObject", "s3:DeleteObjectVersion"]
    writer_id, _ = demo.template("artifacts").one_of_type("AWS::IAM::Role", logical_id_prefix="ArtifactStoreWriterRole")
    assert statement["Principal"] == {"AWS": {"Fn::GetAtt": [writer_id, "Arn"]}}


def test_writer_is_trusted_by_pod_identity_with_tag_session_and_by_sagemaker(demo: Synthesized) -> None:
    _, role = demo.template("artifacts").one_of_type("AWS::IAM::Role", logical_id_prefix="ArtifactStoreWriterRole")
    trust = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    by_service = {s["Principal"]["Service"]: sorted(as_list(s["Action"])) for s in trust}
    assert by_service == {
        "pods.eks.amazonaws.com": ["sts:AssumeRole", "sts:TagSession"],
        "sagemaker.amazonaws.com": ["sts:AssumeRole"],
    }
    # Each is scoped by conditions; what they admit is evaluated in test_policies_as_aws_evaluates.py.
    assert all(s.get("Condition") for s in trust)


def test_writer_may_only_put_and_get_under_experiments(demo: Synthesized) -> None:
    writer = statements(demo, "AWS::IAM::Policy", "ArtifactStoreWriterPolicy")
    s3_statements = [s for s in writer if any(a.startswith("s3:") for a in as_list(s["Action"]))]
    actions = sorted(a for s in s3_statements for a in as_list(s["Action"]))
    assert actions == ["s3:GetObject", "s3:ListBucket", "s3:PutObject"]
    objects = next(s for s in s3_statements if s["Sid"] == "ReadWriteExperiments")
    assert objects["Resource"]["Fn::Join"][1][1] == "/experiments/*"
    listing = next(s for s in s3_statements if s["Sid"] == "ListExperiments")
    assert listing["Condition"] == {"StringLike": {"s3:prefix": ["experiments/", "experiments/*"]}}


def test_writer_has_no_delete_no_wildcard_action_and_no_star_resource_on_s3(demo: Synthesized) -> None:
    writer = statements(demo, "AWS::IAM::Policy", "ArtifactStoreWriterPolicy")
    for statement in writer:
        actions = as_list(statement["Action"])
        assert statement["Effect"] == "Allow"
        assert not any(a.startswith("s3:Delete") or a in ("s3:*", "*") or a.endswith(":*") for a in actions)
        if any(a.startswith("s3:") for a in actions):
            assert statement["Resource"] != "*"


def test_writer_uses_the_key_only_through_s3(demo: Synthesized) -> None:
    writer = statements(demo, "AWS::IAM::Policy", "ArtifactStoreWriterPolicy")
    kms = next(s for s in writer if s["Sid"] == "UseKeyViaS3")
    assert sorted(kms["Action"]) == ["kms:Decrypt", "kms:GenerateDataKey"]
    key_id, _ = demo.template("artifacts").one_of_type("AWS::KMS::Key", logical_id_prefix="ArtifactStoreKey")
    assert kms["Resource"] == {"Fn::GetAtt": [key_id, "Arn"]}
    assert kms["Condition"] == {
        "StringEquals": {"kms:ViaService": {"Fn::Join": ["", ["s3.", {"Ref": "AWS::Region"}, ".amazonaws.com"]]}}
    }


def test_writer_may_put_metric_data_only_in_beacons_and_sagemakers_training_job_namespace(demo: Synthesized) -> None:
    writer = statements(demo, "AWS::IAM::Policy", "ArtifactStoreWriterPolicy")
    metrics = next(s for s in writer if s["Sid"] == "PutBeaconMetrics")
    assert metrics["Action"] == "cloudwatch:PutMetricData"
    namespaces = ["Beacon/demo", "/aws/sagemaker/TrainingJobs"]  # SageMaker's MetricDefinitions, as this role
    assert metrics["Condition"] == {"StringEquals": {"cloudwatch:namespace": namespaces}}


def test_reader_may_only_read_and_list(demo: Synthesized) -> None:
    reader = statements(demo, "AWS::IAM::Policy", "ArtifactStoreReaderPolicy")
    actions = sorted(a for s in reader for a in as_list(s["Action"]))
    assert actions == [
        "cloudwatch:DescribeAlarms",
        "cloudwatch:GetMetricData",
        "cloudwatch:GetMetricStatistics",
        "cloudwatch:ListMetrics",
        "kms:Decrypt",
        # the job's container logs: its cluster's group, and the team's own streams of SageMaker's (the doctor)
        *("logs:DescribeLogStreams", "logs:DescribeLogStreams", "logs:FilterLogEvents"),
        *("logs:GetLogEvents", "logs:GetLogEvents"),
        "s3:GetBucketVersioning",
        "s3:GetObject",
        "s3:GetObjectVersion",
        "s3:ListBucket",
        "s3:ListBucketVersions",
        "sagemaker:DescribeTrainingJob",  # the team's own training jobs
    ]
    writes = ("s3:Put", "s3:Delete", "cloudwatch:Put", "cloudwatch:Delete", "logs:Put", "logs:Create", "sagemaker:")
    assert not any(a.startswith(writes) and a != "sagemaker:DescribeTrainingJob" for a in actions)


def test_stack_outputs_name_bucket_roles_key_and_image_repository(template: Template) -> None:
    outputs = set(template.to_json()["Outputs"])
    assert {"BucketName", "KmsKeyArn", "ReaderRoleArn", "WriterRoleArn", "ImageRepositoryUri"} <= outputs
    template.has_output(
        "ImageRepositoryUri",
        {"Value": {"Fn::Join": ["", Match.array_with([{"Ref": Match.string_like_regexp("^ImageRepository")}])]}},
    )


def test_the_image_repository_is_retained_and_encrypted_with_the_stores_key(template: Template) -> None:
    template.has_resource(
        "AWS::ECR::Repository",
        {
            "Properties": {
                "EncryptionConfiguration": {
                    "EncryptionType": "KMS",
                    "KmsKey": {"Fn::GetAtt": [Match.string_like_regexp("^ArtifactStoreKey"), "Arn"]},
                },
                "ImageTagMutability": "IMMUTABLE",
                "ImageScanningConfiguration": {"ScanOnPush": True},
            },
            "DeletionPolicy": "Retain",
        },
    )


def test_the_image_repository_admits_the_karpenter_node_role_by_name_and_the_writer(demo: Synthesized) -> None:
    """The node role lives in the cluster stack, deployed after this one: the fence names it by its fixed
    name (a reference would make the two stacks depend on each other)."""
    _, repository = demo.template("artifacts").one_of_type("AWS::ECR::Repository", logical_id_prefix="ImageRepository")
    (fence,) = repository["Properties"]["RepositoryPolicyText"]["Statement"]
    admitted = fence["Condition"]["ArnNotEquals"]["aws:PrincipalArn"]
    node_role, writer = admitted
    assert node_role["Fn::Join"][1][-1] == f":role/{names.karpenter_node_role_name('demo')}"
    writer_id, _ = demo.template("artifacts").one_of_type("AWS::IAM::Role", logical_id_prefix="ArtifactStoreWriterRole")
    assert writer == {"Fn::GetAtt": [writer_id, "Arn"]}


def test_every_taggable_resource_carries_team_and_component_tags(demo: Synthesized) -> None:
    for template in demo.templates.values():
        for logical_id, resource in template.resources.items():
            tags = resource.get("Properties", {}).get("Tags")
            if tags is None:
                continue
            keys = {t["Key"]: t["Value"] for t in tags} if isinstance(tags, list) else dict(tags)
            assert keys.get("beacon:team") == "demo", logical_id
            assert keys.get("beacon:component"), logical_id


def test_taggable_artifact_resources_are_tagged_by_their_component(demo: Synthesized) -> None:
    for logical_id, resource in demo.template("artifacts").resources.items():
        tags = {t["Key"]: t["Value"] for t in resource.get("Properties", {}).get("Tags", [])}
        if not tags:
            continue
        component = next(
            c
            for prefix, c in (
                ("ArtifactStore", "artifact-store"),
                ("ImageRepository", "image-repository"),
                ("SmokeImageRepository", "image-repository"),
                ("", "artifact-volume"),
            )
            if logical_id.startswith(prefix)
        )
        assert tags.items() >= {"beacon:component": component, "beacon:team": "demo"}.items(), logical_id
