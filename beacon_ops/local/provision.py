"""Provision, in an embedded AWS (moto server), what a training job touches, from the templates.

moto's CloudFormation lacks BucketPolicy, Alarm and EKS types, so Beacon creates these resources
through the service APIs, with the policy documents taken from the synthesized template.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from beacon_ops.credentials import assume_role_credentials
from beacon_ops.templates import Resolver, Template, TemplateError
from config import names

# Bucket-policy statements moto cannot evaluate faithfully. The template tests assert them.
# - aws:SecureTransport: the embedded server speaks plain HTTP, so it would deny everything.
# - s3:if-none-match: moto never fills this key; it honours the header itself (412 on a second create).
UNEVALUABLE_CONDITION_KEYS = ("aws:SecureTransport", "s3:if-none-match")


@dataclass
class ArtifactStoreHandles:
    bucket: str
    key_arn: str
    writer_role_arn: str
    reader_role_arn: str
    skipped_statements: list[str] = field(default_factory=list)


# Services whose requests moto authorizes against their real resource ARN; it checks all others
# (KMS, SSM, CloudWatch ...) against "*".
MOTO_SCOPED_SERVICES = ("s3", "iam", "sqs", "sts")


def _moto_actions(document: dict[str, Any]) -> dict[str, Any]:
    """Rewrite an identity policy into what moto can authorize, keeping its actions.

    - moto authorizes CloudWatch calls as ``monitoring:*`` (the endpoint prefix), not ``cloudwatch:*``.
    - moto checks services outside MOTO_SCOPED_SERVICES against the resource ``*``, so a scoped
      resource there would never match: those statements are widened to ``*``. In moto, then, the
      writer may use any key, parameter or alarm (and moto ignores every condition anyway): what
      AWS would allow is proven by evaluating the templates (tests/test_policies_as_aws_evaluates.py).
    """
    for statement in document["Statement"]:
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        aliases = [f"monitoring:{a.split(':', 1)[1]}" for a in actions if a.startswith("cloudwatch:")]
        statement["Action"] = actions + aliases
        if not any(a.split(":", 1)[0] in MOTO_SCOPED_SERVICES for a in actions):
            statement["Resource"] = "*"
    return document


def _condition_keys(statement: dict[str, Any]) -> set[str]:
    return {key for operator in statement.get("Condition", {}).values() for key in operator}


def _policy_for_role(template: Template, role_id: str) -> dict[str, Any]:
    """The artifact store's own policy of the role. Others attached to it (the image repository's pull
    grant) concern services a job in the embedded AWS never calls."""
    for logical_id, policy in template.of_type("AWS::IAM::Policy").items():
        if logical_id.startswith("ArtifactStore") and {"Ref": role_id} in policy["Properties"]["Roles"]:
            return dict(policy["Properties"])
    raise TemplateError(f"{template.name}: no AWS::IAM::Policy of the artifact store attached to {role_id}")


def provision_artifact_store(
    template: Template,
    *,
    s3: Any,
    kms: Any,
    iam: Any,
    account: str,
    region: str,
    bucket_name: str,
    trusted_principal_arn: str,
) -> ArtifactStoreHandles:
    """Create the bucket, key and roles of the artifacts template.

    No service assumes roles in the embedded AWS, and moto matches trust principals literally, so
    ``trusted_principal_arn`` (the operator that acts as the job) joins each of the template's
    trust statements beside its service principal.
    """
    bucket_id, _ = template.one_of_type("AWS::S3::Bucket", logical_id_prefix="ArtifactStoreBucket")
    key_id, _ = template.one_of_type("AWS::KMS::Key", logical_id_prefix="ArtifactStoreKey")
    key = kms.create_key(Description="beacon artifact store")["KeyMetadata"]
    role_ids = {
        "writer": template.one_of_type("AWS::IAM::Role", logical_id_prefix="ArtifactStoreWriterRole")[0],
        "reader": template.one_of_type("AWS::IAM::Role", logical_id_prefix="ArtifactStoreReaderRole")[0],
    }
    role_names = {logical_id: f"beacon-{kind}-{bucket_name}"[:64] for kind, logical_id in role_ids.items()}

    def attributes(logical_id: str, attribute: str | None) -> str:
        if logical_id == bucket_id:
            return f"arn:aws:s3:::{bucket_name}" if attribute == "Arn" else bucket_name
        if logical_id == key_id:
            return str(key["Arn"] if attribute == "Arn" else key["KeyId"])
        if logical_id in role_names:
            name = role_names[logical_id]
            return f"arn:aws:iam::{account}:role/{name}" if attribute == "Arn" else name
        raise TemplateError(f"{template.name}: cannot resolve {logical_id}.{attribute} in the embedded AWS")

    resolver = Resolver(account=account, region=region, attributes=attributes)

    s3.create_bucket(Bucket=bucket_name)
    s3.put_bucket_versioning(Bucket=bucket_name, VersioningConfiguration={"Status": "Enabled"})
    s3.put_bucket_encryption(
        Bucket=bucket_name,
        ServerSideEncryptionConfiguration={
            "Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": key["Arn"]}}]
        },
    )

    for logical_id, name in role_names.items():
        role = template.resources[logical_id]["Properties"]
        trust = resolver.resolve(role["AssumeRolePolicyDocument"])
        for statement in trust["Statement"]:
            statement["Principal"] = {**statement["Principal"], "AWS": trusted_principal_arn}
        iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(trust))
        policy = _policy_for_role(template, logical_id)
        iam.put_role_policy(
            RoleName=name,
            PolicyName=policy["PolicyName"],
            PolicyDocument=json.dumps(_moto_actions(resolver.resolve(policy["PolicyDocument"]))),
        )

    skipped = []
    for policy in template.of_type("AWS::S3::BucketPolicy").values():
        if policy["Properties"]["Bucket"] != {"Ref": bucket_id}:
            continue
        document = resolver.resolve(policy["Properties"]["PolicyDocument"])
        kept = []
        for statement in document["Statement"]:
            if _condition_keys(statement) & set(UNEVALUABLE_CONDITION_KEYS):
                skipped.append(statement.get("Sid") or "+".join(sorted(_condition_keys(statement))))
            else:
                kept.append(statement)
        s3.put_bucket_policy(Bucket=bucket_name, Policy=json.dumps({**document, "Statement": kept}))

    return ArtifactStoreHandles(
        bucket=bucket_name,
        key_arn=str(key["Arn"]),
        writer_role_arn=attributes(role_ids["writer"], "Arn"),
        reader_role_arn=attributes(role_ids["reader"], "Arn"),
        skipped_statements=skipped,
    )


@dataclass
class MonitoringHandles:
    topic_arn: str
    run_alarm_parameter: str
    team_alarm_names: list[str]


def provision_monitoring(
    template: Template,
    *,
    cloudwatch: Any,
    ssm: Any,
    sns: Any,
    iam: Any,
    account: str,
    region: str,
    writer_role_name: str,
) -> MonitoringHandles:
    """Create the alarm topic, the team alarms and the run-alarm template of the monitoring stack,
    and attach the stack's grant (the job's own run alarms) to the writer role."""
    topic_id, _ = template.one_of_type("AWS::SNS::Topic")
    topic_arn = sns.create_topic(Name=f"beacon-alarms-{topic_id[-8:].lower()}")["TopicArn"]
    parameter_id, parameter = template.one_of_type("AWS::SSM::Parameter")

    def attributes(logical_id: str, attribute: str | None) -> str:
        if logical_id == topic_id:
            return str(topic_arn)
        if logical_id == parameter_id:
            return str(parameter["Properties"]["Name"])
        raise TemplateError(f"{template.name}: cannot resolve {logical_id}.{attribute} in the embedded AWS")

    resolver = Resolver(account=account, region=region, attributes=attributes)
    properties = resolver.resolve(parameter["Properties"])
    ssm.put_parameter(Name=properties["Name"], Value=properties["Value"], Type="String", Tier=properties["Tier"])
    names = []
    for alarm in template.of_type("AWS::CloudWatch::Alarm").values():
        definition = resolver.resolve(alarm["Properties"])
        cloudwatch.put_metric_alarm(**definition)
        names.append(str(definition["AlarmName"]))
    for policy in template.of_type("AWS::IAM::Policy").values():
        if "WriterRole" not in json.dumps(policy["Properties"]["Roles"]):
            continue  # another role's (the alarm verdict function's): the embedded AWS runs no function
        iam.put_role_policy(
            RoleName=writer_role_name,
            PolicyName=policy["Properties"]["PolicyName"],
            PolicyDocument=json.dumps(_moto_actions(resolver.resolve(policy["Properties"]["PolicyDocument"]))),
        )
    return MonitoringHandles(
        topic_arn=str(topic_arn), run_alarm_parameter=str(properties["Name"]), team_alarm_names=names
    )


@dataclass
class Provisioned:
    """What a job needs from the embedded AWS, and the writer's credentials once IAM is enforced."""

    store: ArtifactStoreHandles
    monitoring: MonitoringHandles
    operator_keys: dict[str, str]

    def writer_credentials(self, sts: Any, session_name: str = "beacon-job") -> dict[str, str]:
        return self.role_credentials(sts, self.store.writer_role_arn, session_name)

    role_credentials = staticmethod(assume_role_credentials)


OPERATOR = "beacon-operator"


def provision_team(
    templates: dict[str, Template], team: str, *, clients: Callable[[str], Any], account: str, region: str, bucket: str
) -> Provisioned:
    """Provision the artifact and monitoring stacks, and an operator user that may assume their roles."""
    iam = clients("iam")
    # The operator reads as a team's reader may: tagged as the reader role's trust asks (moto does not check the tag;
    # a real account does: `aws iam tag-role --role-name <yours> --tags Key=beacon-reader-<team>,Value=true`).
    operator = iam.create_user(UserName=OPERATOR, Tags=[{"Key": names.reader_tag(team), "Value": "true"}])["User"]
    iam.put_user_policy(
        UserName=OPERATOR,
        PolicyName="assume-beacon-roles",
        PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole", "Resource": "*"}]}
        ),
    )
    keys = iam.create_access_key(UserName=OPERATOR)["AccessKey"]
    store = provision_artifact_store(
        templates[names.stack_name(team, "artifacts")],
        s3=clients("s3"),
        kms=clients("kms"),
        iam=iam,
        account=account,
        region=region,
        bucket_name=bucket,
        trusted_principal_arn=operator["Arn"],
    )
    monitoring = provision_monitoring(
        templates[names.stack_name(team, "monitoring")],
        cloudwatch=clients("cloudwatch"),
        ssm=clients("ssm"),
        sns=clients("sns"),
        iam=iam,
        account=account,
        region=region,
        writer_role_name=store.writer_role_arn.rsplit("/", 1)[1],
    )
    return Provisioned(
        store, monitoring, {"aws_access_key_id": keys["AccessKeyId"], "aws_secret_access_key": keys["SecretAccessKey"]}
    )
