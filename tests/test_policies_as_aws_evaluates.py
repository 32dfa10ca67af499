"""Would the service that must act be allowed to? Asked of the synthesized templates, as AWS
evaluates policies (tests/support/policy_eval.py), for two teams deployed into one account.

moto ignores every condition in identity policies, so none of these answers can come from it.
Each test names the item of issue 11 (or issue 14: the image repository) it proves.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from beacon import contract
from smoke_job.config import parse_args

from beacon_constructs.image_repository import FENCED_ACTIONS, PULL_ACTIONS, PUSH_ACTIONS
from beacon_ops.templates import kubernetes_objects
from config import TeamConfig, names
from tests.conftest import VISION_OPERATOR, VISION_READER
from tests.support.policy_eval import (
    ACCOUNT,
    REGION,
    Decision,
    Deployment,
    PolicyDoc,
    PolicyKind,
    Request,
    explain,
    merge,
    wildcard_match,
)
from tests.support.synth import Synthesized
from workloads import manifests

DEMO, VISION = "demo", "vision"
TLS = {"aws:SecureTransport": True}
OTHER_ACCOUNT = "444455556666"


@pytest.fixture(scope="module")
def aws(demo: Synthesized, vision: Synthesized) -> Deployment:
    return Deployment(merge(demo.templates, vision.templates))


def stack(team: str, component: str) -> str:
    return names.stack_name(team, component)


def arn_of(aws: Deployment, team: str, component: str, resource_type: str, prefix: str = "") -> str:
    name = stack(team, component)
    return aws.arn(name, aws.find(name, resource_type, prefix))


def writer(aws: Deployment, team: str) -> str:
    return arn_of(aws, team, "artifacts", "AWS::IAM::Role", "ArtifactStoreWriterRole")


def bucket_arn(aws: Deployment, team: str) -> str:
    return arn_of(aws, team, "artifacts", "AWS::S3::Bucket", "ArtifactStoreBucket")


def topic_arn(aws: Deployment, team: str) -> str:
    name = stack(team, "monitoring")
    return str(aws.resolve(name, {"Ref": aws.find(name, "AWS::SNS::Topic")}))


def alarm_arn(name: str) -> str:
    return f"arn:aws:cloudwatch:{REGION}:{ACCOUNT}:alarm:{name}"


def run_alarms(aws: Deployment, team: str, experiment: str = "exp1", run: str = "run1") -> dict[str, Any]:
    name = stack(team, "monitoring")
    parameter = aws.templates[name].resources[aws.find(name, "AWS::SSM::Parameter")]
    return contract.render_run_alarms(str(aws.resolve(name, parameter["Properties"]["Value"])), experiment, run)


def decide(aws: Deployment, request: Request) -> Decision:
    return aws.decide(request).decision


def assert_allowed(aws: Deployment, request: Request) -> None:
    explanation = aws.decide(request)
    assert explanation.decision is Decision.ALLOW, f"{request} -> {explanation}"


def assert_refused(aws: Deployment, request: Request) -> None:
    explanation = aws.decide(request)
    assert explanation.decision is not Decision.ALLOW, f"{request} -> {explanation}"


# --- item 3: alarms reach someone -------------------------------------------------------------
def notifying_alarms(aws: Deployment, team: str) -> list[tuple[str, list[str]]]:
    """(alarm ARN, topics it notifies) for the template's alarms and the run-alarm template."""
    name = stack(team, "monitoring")
    out = []
    for kind in ("AWS::CloudWatch::Alarm", "AWS::CloudWatch::CompositeAlarm"):
        for resource in aws.templates[name].of_type(kind).values():
            alarm = aws.resolve(name, resource["Properties"])
            out.append((alarm_arn(alarm["AlarmName"]), alarm.get("AlarmActions", []) + alarm.get("OKActions", [])))
    composite = run_alarms(aws, team)["composite_alarm"]
    out.append((alarm_arn(composite["AlarmName"]), composite["AlarmActions"] + composite["OKActions"]))
    return [(alarm, topics) for alarm, topics in out if topics]


def topic_key_arn(aws: Deployment, team: str, topic: str) -> str:
    name = stack(team, "monitoring")
    for logical_id, resource in aws.templates[name].of_type("AWS::SNS::Topic").items():
        if aws.resolve(name, {"Ref": logical_id}) == topic:
            return str(aws.resolve(name, resource["Properties"]["KmsMasterKeyId"]))
    raise AssertionError(f"no topic {topic} in {name}")


@pytest.mark.parametrize("team", [DEMO, VISION])
def test_item3_cloudwatch_may_publish_every_alarm_notification_and_use_the_topic_key(
    aws: Deployment, team: str
) -> None:
    alarms = notifying_alarms(aws, team)
    assert len(alarms) >= 2  # the restarts alarm and each run's metrics-lost composite
    for alarm, topics in alarms:
        for topic in topics:
            on_behalf = {"aws:SourceArn": alarm, "aws:SourceAccount": ACCOUNT, **TLS}
            assert_allowed(aws, Request("sns:Publish", topic, "cloudwatch.amazonaws.com", on_behalf))
            key = topic_key_arn(aws, team, topic)
            for action in ("kms:GenerateDataKey", "kms:Decrypt"):
                assert_allowed(aws, Request(action, key, "cloudwatch.amazonaws.com", on_behalf))


def test_item3_cloudwatch_may_not_publish_for_another_teams_or_accounts_alarms(aws: Deployment) -> None:
    topic = topic_arn(aws, DEMO)
    vision_alarm = alarm_arn(run_alarms(aws, VISION)["composite_alarm"]["AlarmName"])
    foreign = {"aws:SourceArn": vision_alarm, "aws:SourceAccount": ACCOUNT, **TLS}
    assert_refused(aws, Request("sns:Publish", topic, "cloudwatch.amazonaws.com", foreign))
    own_name = run_alarms(aws, DEMO)["composite_alarm"]["AlarmName"]
    other_account = {
        "aws:SourceArn": f"arn:aws:cloudwatch:{REGION}:{OTHER_ACCOUNT}:alarm:{own_name}",
        "aws:SourceAccount": OTHER_ACCOUNT,
        **TLS,
    }
    assert_refused(aws, Request("sns:Publish", topic, "cloudwatch.amazonaws.com", other_account))


# --- item 1: the volume mounts ----------------------------------------------------------------
def volume_mount(aws: Deployment, team: str) -> tuple[str, str, str]:
    """(the EFS CSI node pods' role, file system ARN, access point ARN)."""
    cluster = stack(team, "cluster")
    roles = [
        aws.resolve(cluster, association["Properties"]["RoleArn"])
        for association in aws.templates[cluster].of_type("AWS::EKS::PodIdentityAssociation").values()
        if association["Properties"]["ServiceAccount"] == manifests.EFS_CSI_NODE_SERVICE_ACCOUNT
    ]
    assert len(roles) == 1, f"the EFS CSI driver's node pods need one identity to mount with, found {roles}"
    return (
        roles[0],
        arn_of(aws, team, "artifacts", "AWS::EFS::FileSystem"),
        arn_of(aws, team, "artifacts", "AWS::EFS::AccessPoint"),
    )


def test_item1_the_persistent_volume_mounts_with_iam_over_tls(demo: Synthesized) -> None:
    objects = [o for objs in kubernetes_objects(demo.template("cluster")).values() for o in objs]
    volume = next(o for o in objects if o["kind"] == "PersistentVolume")
    assert {"iam", "tls"} <= set(volume["spec"].get("mountOptions", []))


def test_item1_the_efs_csi_driver_may_mount_and_write_through_the_access_point_over_tls(aws: Deployment) -> None:
    role, file_system, access_point = volume_mount(aws, DEMO)
    mount = {"elasticfilesystem:AccessedViaMountTarget": True, "elasticfilesystem:AccessPointArn": access_point}
    for action in ("elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite"):
        assert_allowed(aws, Request(action, file_system, role, {**mount, **TLS}))
        assert decide(aws, Request(action, file_system, role, {**mount, "aws:SecureTransport": False})) is (
            Decision.EXPLICIT_DENY
        )
    # Pod Identity hands that role to the driver's node pods of this cluster only.
    cluster = arn_of(aws, DEMO, "cluster", "AWS::EKS::Cluster")
    tags = {
        "aws:RequestTag/eks-cluster-arn": cluster,
        "aws:RequestTag/kubernetes-namespace": "kube-system",
        "aws:RequestTag/kubernetes-service-account": manifests.EFS_CSI_NODE_SERVICE_ACCOUNT,
    }
    for action in ("sts:AssumeRole", "sts:TagSession"):
        assert_allowed(aws, Request(action, role, "pods.eks.amazonaws.com", tags))
        elsewhere = {**tags, "aws:RequestTag/kubernetes-namespace": "training"}
        assert_refused(aws, Request(action, role, "pods.eks.amazonaws.com", elsewhere))


def test_item1_an_anonymous_client_may_neither_mount_nor_write(aws: Deployment) -> None:
    _, file_system, access_point = volume_mount(aws, DEMO)
    mount = {"elasticfilesystem:AccessedViaMountTarget": True, "elasticfilesystem:AccessPointArn": access_point, **TLS}
    for action in (
        "elasticfilesystem:ClientMount",
        "elasticfilesystem:ClientWrite",
        "elasticfilesystem:ClientRootAccess",
    ):
        assert_refused(aws, Request(action, file_system, None, mount))


# --- item 5: the interruption queue -------------------------------------------------------------
def test_item5_only_the_five_interruption_rules_may_send_to_the_queue(aws: Deployment) -> None:
    cluster = stack(DEMO, "cluster")
    queue_id = aws.find(cluster, "AWS::SQS::Queue", "KarpenterInterruptionQueue")
    queue = aws.arn(cluster, queue_id)
    rules = [
        aws.arn(cluster, logical_id)
        for logical_id, rule in aws.templates[cluster].of_type("AWS::Events::Rule").items()
        if any(t["Arn"] == {"Fn::GetAtt": [queue_id, "Arn"]} for t in rule["Properties"]["Targets"])
    ]
    assert len(rules) == 5
    for rule in rules:
        assert_allowed(aws, Request("sqs:SendMessage", queue, "events.amazonaws.com", {"aws:SourceArn": rule, **TLS}))
    forged = [
        ("events.amazonaws.com", {"aws:SourceArn": f"arn:aws:events:{REGION}:{ACCOUNT}:rule/forged-spot-warning"}),
        ("events.amazonaws.com", {"aws:SourceArn": f"arn:aws:events:{REGION}:{OTHER_ACCOUNT}:rule/x"}),
        ("events.amazonaws.com", {}),
        ("sqs.amazonaws.com", {"aws:SourceArn": f"arn:aws:sqs:{REGION}:{OTHER_ACCOUNT}:q"}),
    ]
    for principal, context in forged:
        assert_refused(aws, Request("sqs:SendMessage", queue, principal, {**context, **TLS}))


# --- item 7: SageMaker's checkpoint sync --------------------------------------------------------
def object_arn(aws: Deployment, team: str, key: str) -> str:
    return f"{bucket_arn(aws, team)}/{key}"


def put(aws: Deployment, team: str, key: str, **context: Any) -> Request:
    return Request(
        "s3:PutObject",
        object_arn(aws, team, key),
        writer(aws, team),
        {"s3:ObjectCreationOperation": True, **TLS, **context},
    )


def test_item7_sagemaker_checkpoint_sync_passes_the_bucket_policy(aws: Deployment, demo_config: TeamConfig) -> None:
    bucket = bucket_arn(aws, DEMO).removeprefix("arn:aws:s3:::")
    spec = manifests.smoke_job_spec(demo_config, image="image", bucket=bucket, region=REGION)
    sync_prefix = manifests.sagemaker_container(spec).checkpoint_s3_uri.removeprefix(f"s3://{bucket}/")
    # The volume holds the spool (sealed chunks, TensorBoard files) and checkpoints, each under
    # <experiment>/<run>: the sync uploads them file by file, with no If-None-Match.
    for path in (
        f"spool/{spec.experiment}/{spec.name}/events/chunk-00000001.jsonl",
        f"spool/{spec.experiment}/{spec.name}/tensorboard/events.out.tfevents.1",
        f"checkpoints/{spec.experiment}/{spec.name}/step-00000050.pt",
    ):
        assert_allowed(aws, put(aws, DEMO, sync_prefix + path))


@pytest.mark.parametrize(
    ("experiment", "run"), [("exp1", "run1"), ("checkpoints", "sagemaker-volume"), ("status", "x")]
)
def test_item7_history_stays_create_only(aws: Deployment, experiment: str, run: str) -> None:
    assert set(contract.APPEND_ONLY_KINDS).isdisjoint(contract.OVERWRITABLE_KINDS)
    for key in (
        contract.events_key(experiment, run, 1),
        contract.tensorboard_key(experiment, run, "f"),
        contract.hyperparams_key(experiment, run),
    ):
        assert decide(aws, put(aws, DEMO, key)) is Decision.EXPLICIT_DENY, key
        assert_allowed(aws, put(aws, DEMO, key, **{"s3:if-none-match": "*"}))
        # Multipart parts carry no header and create nothing on their own.
        assert_allowed(aws, put(aws, DEMO, key, **{"s3:ObjectCreationOperation": False}))
    assert_allowed(aws, put(aws, DEMO, contract.checkpoint_key(experiment, run, 50)))
    assert_allowed(aws, put(aws, DEMO, contract.final_status_key(experiment, run)))


def test_item7_the_ranks_evidence_live_snapshots_too_is_create_only_for_the_writer(aws: Deployment) -> None:
    """Issue 17: rank 0 uploads the ranks' evidence at an attempt's end and, while a rank stalls, as live
    snapshots; the other nodes' leaders (the same writer role) what rank 0 cannot. No grant of their own:
    the writer's PutObject covers every key under `experiments/`, and `ranks/` is not an overwritable kind,
    so the bucket policy lets a create-only write through and nothing else."""
    assert contract.RANKS not in contract.OVERWRITABLE_KINDS
    for key in (
        contract.rank_evidence_key("exp1", "run1", 0, "stacks-rank-00003.txt"),
        contract.live_rank_evidence_key("exp1", "run1", 0, 0, "stacks-rank-00003.txt"),
        contract.live_rank_evidence_key("exp1", "run1", 3, 12, contract.LIVE_SNAPSHOT_COMPLETE),
        # a node leader's, when rank 0 stopped or the ranks directory is node-local (`beacon.evidence.node_leader`)
        contract.node_rank_evidence_key("exp1", "run1", 0, 1, "stacks-rank-00003.txt"),
        contract.node_rank_evidence_key("exp1", "run1", 0, 1, contract.LIVE_SNAPSHOT_COMPLETE, snapshot=0),
    ):
        assert_allowed(aws, put(aws, DEMO, key, **{"s3:if-none-match": "*"}))
        assert decide(aws, put(aws, DEMO, key)) is Decision.EXPLICIT_DENY, key
        other_writer = {"s3:ObjectCreationOperation": True, "s3:if-none-match": "*", **TLS}
        assert_refused(aws, Request("s3:PutObject", object_arn(aws, DEMO, key), writer(aws, VISION), other_writer))


# --- item 11: teams sharing an account ------------------------------------------------------
def test_item11_a_writer_cannot_feed_another_teams_alarms(aws: Deployment) -> None:
    for team, other in ((DEMO, VISION), (VISION, DEMO)):
        for alarm in run_alarms(aws, other)["metric_alarms"]:
            theirs = {"cloudwatch:namespace": alarm["Namespace"]}
            assert_refused(aws, Request("cloudwatch:PutMetricData", "*", writer(aws, team), theirs))
        own = {"cloudwatch:namespace": run_alarms(aws, team)["metric_alarms"][0]["Namespace"]}
        assert_allowed(aws, Request("cloudwatch:PutMetricData", "*", writer(aws, team), own))


@pytest.mark.parametrize("team", [DEMO, VISION])
def test_item11_job_alarms_and_dashboard_share_the_teams_namespace(
    demo: Synthesized, aws: Deployment, team: str
) -> None:
    namespace = parse_args(["--team", team, "--telemetry", "false"]).namespace
    assert namespace == contract.metric_namespace(team) != contract.metric_namespace(VISION if team == DEMO else DEMO)
    assert {a["Namespace"] for a in run_alarms(aws, team)["metric_alarms"]} == {namespace}
    monitoring = aws.templates[stack(team, "monitoring")]
    for alarm in monitoring.of_type("AWS::CloudWatch::Alarm").values():
        if alarm["Properties"].get("Namespace", "").startswith(contract.NAMESPACE_PREFIX):
            assert alarm["Properties"]["Namespace"] == namespace
    dashboard = json.dumps(next(iter(monitoring.of_type("AWS::CloudWatch::Dashboard").values())))
    assert f"{{{namespace}," in dashboard and "{Beacon," not in dashboard


def test_item11_a_writer_cannot_touch_another_teams_alarms(aws: Deployment) -> None:
    vision_alarms = [a["AlarmName"] for a in run_alarms(aws, VISION)["metric_alarms"]]
    vision_alarms += [contract.team_alarm_name(VISION, kind) for kind in contract.TeamAlarm]
    for name in vision_alarms:
        for action in ("cloudwatch:PutMetricAlarm", "cloudwatch:PutCompositeAlarm", "cloudwatch:DeleteAlarms"):
            assert_refused(aws, Request(action, alarm_arn(name), writer(aws, DEMO)))
    for name in [a["AlarmName"] for a in run_alarms(aws, DEMO)["metric_alarms"]]:
        assert_allowed(aws, Request("cloudwatch:DeleteAlarms", alarm_arn(name), writer(aws, DEMO)))


def test_item11_team_names_that_would_share_an_alarm_prefix_are_refused(demo_config: TeamConfig) -> None:
    for team in ("demo-run", "demo-run-x", "a-b-run-c"):
        with pytest.raises(ValueError, match="run"):
            TeamConfig.model_validate({**demo_config.model_dump(), "team": team, "account": ACCOUNT})
    # Among names that are accepted, no team's run-alarm grant matches another team's alarm.
    accepted = ["demo", "demo-x", "demo-runner", "run-demo", "runs", "demo-rung", "a-b", "a"]
    accepted = [t for t in accepted if contract.alarm_prefix_collision(t) is None]
    for team in accepted:
        pattern = f"{contract.run_alarm_prefix(team)}*"
        for other in accepted:
            if other == team:
                continue
            names = [contract.team_alarm_name(other, kind) for kind in contract.TeamAlarm]
            names += [contract.run_alarm_name(other, "e", "r", kind) for kind in contract.RunAlarm]
            assert not [n for n in names if wildcard_match(pattern, n)], (team, other)


def test_item11_a_run_alarm_may_notify_only_the_teams_topic(aws: Deployment) -> None:
    composite = run_alarms(aws, DEMO)["composite_alarm"]
    target = alarm_arn(composite["AlarmName"])
    own = {"cloudwatch:AlarmActions": composite["AlarmActions"]}
    assert own["cloudwatch:AlarmActions"] == [topic_arn(aws, DEMO)]
    assert_allowed(aws, Request("cloudwatch:PutCompositeAlarm", target, writer(aws, DEMO), own))
    assert_allowed(aws, Request("cloudwatch:PutMetricAlarm", target, writer(aws, DEMO)))  # no actions at all
    for topics in ([topic_arn(aws, VISION)], [topic_arn(aws, DEMO), f"arn:aws:sns:{REGION}:{ACCOUNT}:anything"]):
        other = {"cloudwatch:AlarmActions": topics}
        for action in ("cloudwatch:PutCompositeAlarm", "cloudwatch:PutMetricAlarm"):
            assert_refused(aws, Request(action, target, writer(aws, DEMO), other))


def pod_identity_tags(cluster: str, namespace: str, service_account: str) -> dict[str, str]:
    return {
        "aws:RequestTag/eks-cluster-arn": f"arn:aws:eks:{REGION}:{ACCOUNT}:cluster/{cluster}",
        "aws:RequestTag/eks-cluster-name": cluster,
        "aws:RequestTag/kubernetes-namespace": namespace,
        "aws:RequestTag/kubernetes-service-account": service_account,
    }


def test_item11_the_writer_is_handed_out_only_to_its_own_training_pods(aws: Deployment) -> None:
    role = writer(aws, DEMO)
    service_account = manifests.TRAINING_SERVICE_ACCOUNT
    own = pod_identity_tags(names.cluster_name(DEMO), contract.TRAINING_NAMESPACE, service_account)
    assert own["aws:RequestTag/eks-cluster-arn"] == arn_of(aws, DEMO, "cluster", "AWS::EKS::Cluster")
    for action in ("sts:AssumeRole", "sts:TagSession"):
        assert_allowed(aws, Request(action, role, "pods.eks.amazonaws.com", own))
        for foreign in (
            pod_identity_tags(names.cluster_name(VISION), contract.TRAINING_NAMESPACE, service_account),
            pod_identity_tags(names.cluster_name(DEMO), "default", service_account),
            pod_identity_tags(names.cluster_name(DEMO), contract.TRAINING_NAMESPACE, "default"),
            {},
        ):
            assert_refused(aws, Request(action, role, "pods.eks.amazonaws.com", foreign))


def test_item11_sagemaker_hands_out_the_writer_only_to_this_accounts_training_jobs(aws: Deployment) -> None:
    role = writer(aws, DEMO)
    job = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:training-job/{names.training_job_name(DEMO, 'beacon-smoke-1')}"
    assert_allowed(
        aws,
        Request(
            "sts:AssumeRole", role, "sagemaker.amazonaws.com", {"aws:SourceAccount": ACCOUNT, "aws:SourceArn": job}
        ),
    )
    vision_job = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:training-job/{names.training_job_name(VISION, 'r1')}"
    for context in (
        {"aws:SourceAccount": ACCOUNT, "aws:SourceArn": vision_job},  # another team's job of the same account
        {"aws:SourceAccount": OTHER_ACCOUNT, "aws:SourceArn": job.replace(ACCOUNT, OTHER_ACCOUNT)},
        {"aws:SourceAccount": ACCOUNT, "aws:SourceArn": f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:notebook-instance/x"},
        {},
    ):
        assert_refused(aws, Request("sts:AssumeRole", role, "sagemaker.amazonaws.com", context))


# --- item 12: what moto cannot tell -----------------------------------------------------------
# These held on the original templates too: the defect was that no test could tell (moto ignores
# the conditions, and the provisioning widened resources to *). Now each is evaluated.
def test_item12_the_writer_lists_only_under_experiments(aws: Deployment) -> None:
    role, bucket = writer(aws, DEMO), bucket_arn(aws, DEMO)
    assert_allowed(aws, Request("s3:ListBucket", bucket, role, {"s3:prefix": "experiments/exp1/", **TLS}))
    for prefix in ("", "other/", "experiment"):
        assert_refused(aws, Request("s3:ListBucket", bucket, role, {"s3:prefix": prefix, **TLS}))
    assert_refused(aws, Request("s3:ListBucket", bucket, role, TLS))
    assert_refused(aws, Request("s3:GetObject", f"{bucket}/elsewhere/x", role, TLS))
    assert_refused(aws, Request("s3:PutObject", f"{bucket_arn(aws, VISION)}/experiments/e/r/checkpoints/x", role, TLS))


def test_item12_the_writer_uses_the_key_only_through_s3(aws: Deployment) -> None:
    role = writer(aws, DEMO)
    key = arn_of(aws, DEMO, "artifacts", "AWS::KMS::Key", "ArtifactStoreKey")
    via_s3 = {"kms:ViaService": f"s3.{REGION}.amazonaws.com"}
    for action in ("kms:GenerateDataKey", "kms:Decrypt"):
        assert_allowed(aws, Request(action, key, role, via_s3))
        assert_refused(aws, Request(action, key, role))
        assert_refused(aws, Request(action, key, role, {"kms:ViaService": f"sns.{REGION}.amazonaws.com"}))
    # kms:Encrypt is the one direct use (issue 25: SageMaker's output key), and it decrypts nothing.
    assert_refused(aws, Request("kms:ReEncryptFrom", key, role, via_s3))


def test_item12_the_writer_reads_only_its_own_run_alarm_template(aws: Deployment) -> None:
    role = writer(aws, DEMO)

    def parameter(name: str) -> str:
        return f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter{name}"

    assert_allowed(aws, Request("ssm:GetParameter", parameter(contract.run_alarm_parameter_name(DEMO)), role))
    for other in (contract.run_alarm_parameter_name(VISION), "/cdk-bootstrap/hnb659fds/version", "/anything"):
        assert_refused(aws, Request("ssm:GetParameter", parameter(other), role))
    assert_refused(aws, Request("ssm:GetParameters", parameter(contract.run_alarm_parameter_name(DEMO)), role))


# --- issue 14: the team's image repository ------------------------------------------------------
def repository(aws: Deployment, team: str) -> str:
    return arn_of(aws, team, "artifacts", "AWS::ECR::Repository", "ImageRepository")


def node_role(aws: Deployment, team: str) -> str:
    """The Karpenter node role as deployed: it carries AmazonEC2ContainerRegistryPullOnly (vendored text)."""
    role = arn_of(aws, team, "cluster", "AWS::IAM::Role", "KarpenterNodeRole")
    assert role.endswith(f":role/{names.karpenter_node_role_name(team)}")
    return role


@pytest.mark.parametrize("team", [DEMO, VISION])
def test_item14_the_node_role_and_sagemakers_execution_role_may_pull_the_teams_images(
    aws: Deployment, team: str
) -> None:
    """On EKS the kubelet pulls with the node's role; SageMaker pulls as the job's execution role (the writer)."""
    for role in (node_role(aws, team), writer(aws, team)):
        assert_allowed(aws, Request("ecr:GetAuthorizationToken", "*", role))
        for action in PULL_ACTIONS:
            assert_allowed(aws, Request(action, repository(aws, team), role))


def test_item14_another_teams_roles_may_neither_pull_nor_push(aws: Deployment) -> None:
    """The node role's managed policy allows pulling from any repository of the account: the repository's
    own policy is what refuses the other team's node role (explicitly), whatever it is granted."""
    for team, other in ((DEMO, VISION), (VISION, DEMO)):
        for action in FENCED_ACTIONS:
            request = Request(action, repository(aws, team), node_role(aws, other))
            assert decide(aws, request) is Decision.EXPLICIT_DENY, request
            assert_refused(aws, Request(action, repository(aws, team), writer(aws, other)))


def test_item14_neither_the_writer_nor_the_node_role_may_push(aws: Deployment) -> None:
    """The pod's role (the writer) runs training; it never needs to push. Pushing is for push_role_arns."""
    for action in PUSH_ACTIONS:
        for role in (writer(aws, DEMO), node_role(aws, DEMO)):
            assert_refused(aws, Request(action, repository(aws, DEMO), role))
    artifacts = stack(DEMO, "artifacts")
    images = aws.templates[artifacts].resources[aws.find(artifacts, "AWS::ECR::Repository", "ImageRepository")]
    statements = images["Properties"]["RepositoryPolicyText"]["Statement"]
    assert [s["Effect"] for s in statements] == ["Deny"], "the demo team names no pusher: the fence alone"


# --- issue 16: the doctor's reader reads its team's job logs and training jobs, and no other team's -------------
def reader(aws: Deployment, team: str) -> str:
    return arn_of(aws, team, "artifacts", "AWS::IAM::Role", "ArtifactStoreReaderRole")


def log_group_arn(group: str) -> str:
    return f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{group}"


def log_stream_arn(group: str, stream: str) -> str:
    return f"{log_group_arn(group)}:log-stream:{stream}"


CLUSTER_LOG_ACTIONS = ("logs:FilterLogEvents", "logs:GetLogEvents", "logs:DescribeLogStreams")


def test_issue16_the_reader_reads_its_own_clusters_container_logs_only(aws: Deployment) -> None:
    role = reader(aws, DEMO)
    own, other = (
        names.container_log_group(names.cluster_name(DEMO)),
        names.container_log_group(names.cluster_name(VISION)),
    )
    pod_stream = "ip-10-0-2-7.ec2.internal-application.var.log.containers.r1-0-abcde_training_train-0a1b.log"
    for group in (log_group_arn(own), f"{log_group_arn(own)}:*"):
        for action in ("logs:FilterLogEvents", "logs:DescribeLogStreams"):
            assert_allowed(aws, Request(action, group, role))
    assert_allowed(aws, Request("logs:GetLogEvents", log_stream_arn(own, pod_stream), role))
    for group in (other, f"/aws/containerinsights/{names.cluster_name(DEMO)}/performance", "/aws/lambda/x"):
        for action in CLUSTER_LOG_ACTIONS:
            assert_refused(aws, Request(action, log_group_arn(group), role))
        assert_refused(aws, Request("logs:GetLogEvents", log_stream_arn(group, pod_stream), role))
    for action in ("logs:PutLogEvents", "logs:DeleteLogGroup", "logs:StartQuery"):
        assert_refused(aws, Request(action, log_group_arn(own), role))


def test_issue16_in_the_shared_sagemaker_group_the_reader_reads_only_its_teams_jobs_streams(aws: Deployment) -> None:
    role, group = reader(aws, DEMO), names.SAGEMAKER_LOG_GROUP
    own = f"{names.training_job_name(DEMO, 'r1')}/algo-1-1764583200"
    theirs = f"{names.training_job_name(VISION, 'r1')}/algo-1-1764583200"
    assert_allowed(aws, Request("logs:GetLogEvents", log_stream_arn(group, own), role))
    for stream in (theirs, "demo/algo-1-1", "someone-elses-job/algo-1-1", "r1/algo-1-1"):
        assert_refused(aws, Request("logs:GetLogEvents", log_stream_arn(group, stream), role))
    # Listing stream names is a group action: granted, it reads no line. Filtering would read every team's lines.
    assert_allowed(aws, Request("logs:DescribeLogStreams", log_group_arn(group), role))
    assert_refused(aws, Request("logs:FilterLogEvents", log_group_arn(group), role))
    assert_refused(aws, Request("logs:FilterLogEvents", f"{log_group_arn(group)}:*", role))
    # The other team's reader, the same way round.
    assert_allowed(aws, Request("logs:GetLogEvents", log_stream_arn(group, theirs), reader(aws, VISION)))
    assert_refused(aws, Request("logs:GetLogEvents", log_stream_arn(group, own), reader(aws, VISION)))


def test_issue16_the_reader_describes_only_its_teams_training_jobs(aws: Deployment) -> None:
    role = reader(aws, DEMO)

    def job(name: str) -> str:
        return f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:training-job/{name}"

    assert_allowed(aws, Request("sagemaker:DescribeTrainingJob", job(names.training_job_name(DEMO, "r1")), role))
    for name in (names.training_job_name(VISION, "r1"), "r1", "demo-r1"):
        assert_refused(aws, Request("sagemaker:DescribeTrainingJob", job(name), role))
    for action in ("sagemaker:StopTrainingJob", "sagemaker:CreateTrainingJob", "sagemaker:ListTrainingJobs"):
        assert_refused(aws, Request(action, job(names.training_job_name(DEMO, "r1")), role))


def test_issue16_no_teams_training_job_prefix_holds_another_teams() -> None:
    """The run-alarm rule (no 'run' after a hyphen) keeps the prefixes apart: a team's reader never matches
    another team's jobs."""
    for team, other in (("demo", "demo-x"), ("a-b", "a"), ("ab", "a")):
        assert not names.training_job_prefix(other).startswith(names.training_job_prefix(team))
        assert not names.training_job_prefix(team).startswith(names.training_job_prefix(other))
    assert contract.alarm_prefix_collision("demo-run") is not None  # the team that would hold demo's jobs


# --- issue 25: what SageMaker itself does as the job's execution role, at a job's edges -------------------------
def sagemaker_job(demo_config: TeamConfig, aws: Deployment, team: str = DEMO) -> tuple[str, str]:
    """(the output prefix a SageMaker job of `team` is given, the job's name), as `beacon run --target sagemaker`
    gives them."""
    bucket = bucket_arn(aws, team).removeprefix("arn:aws:s3:::")
    spec = manifests.smoke_job_spec(demo_config, image="image", bucket=bucket, region=REGION)
    return (
        manifests.sagemaker_container(spec).output_s3_uri.removeprefix(f"s3://{bucket}/"),
        names.training_job_name(team, spec.name),
    )


def test_issue25_item1_sagemakers_output_upload_passes_the_bucket_policy_there_and_only_there(
    aws: Deployment, demo_config: TeamConfig
) -> None:
    """At a job's end SageMaker uploads <output>/<job>/output/model.tar.gz with a plain PutObject, output.tar.gz
    maybe by a multipart upload: no If-None-Match on either. The job's own history stays create-only."""
    output, job = sagemaker_job(demo_config, aws)
    for name in ("model.tar.gz", "output.tar.gz"):
        key = f"{output}{job}/output/{name}"
        assert_allowed(aws, put(aws, DEMO, key))  # PutObject or CompleteMultipartUpload, no header
        assert_allowed(aws, put(aws, DEMO, key, **{"s3:ObjectCreationOperation": False}))  # its parts
    run = output.removesuffix(f"{contract.SAGEMAKER_OUTPUT}/")
    for kind in contract.APPEND_ONLY_KINDS:  # the same unconditional PUT beside it is refused
        assert decide(aws, put(aws, DEMO, f"{run}{kind}/model.tar.gz")) is Decision.EXPLICIT_DENY
    key, context = f"{output}{job}/output/model.tar.gz", {"s3:ObjectCreationOperation": True, **TLS}
    assert_refused(aws, Request("s3:PutObject", object_arn(aws, DEMO, key), writer(aws, VISION), context))


def test_issue25_item1_sagemaker_may_encrypt_the_output_with_the_teams_key_and_no_other(
    aws: Deployment,
) -> None:
    """With OutputDataConfig.KmsKeyId set, SageMaker's API reference asks the execution role for kms:Encrypt on that
    key (and the key policy must admit the role: the store key's admits the account's IAM policies). The key a job is
    launched with is the store's (`beacon run`'s stack outputs); no other team's key; the reader encrypts nothing."""
    own = arn_of(aws, DEMO, "artifacts", "AWS::KMS::Key", "ArtifactStoreKey")
    theirs = arn_of(aws, VISION, "artifacts", "AWS::KMS::Key", "ArtifactStoreKey")
    assert_allowed(aws, Request("kms:Encrypt", own, writer(aws, DEMO)))
    assert_refused(aws, Request("kms:Encrypt", theirs, writer(aws, DEMO)))
    assert_refused(aws, Request("kms:Encrypt", own, reader(aws, DEMO)))
    assert_refused(aws, Request("kms:Decrypt", own, writer(aws, DEMO)))  # only through S3, as before


def test_issue25_item3_the_execution_role_writes_its_own_jobs_logs_and_sagemakers_metric_namespace(
    aws: Deployment, demo_config: TeamConfig
) -> None:
    """CreateTrainingJob's RoleArn: SageMaker writes the container log to /aws/sagemaker/TrainingJobs and publishes
    the MetricDefinitions under that namespace, as the role. The team's jobs' streams only; nothing wider."""
    role, group = writer(aws, DEMO), names.SAGEMAKER_LOG_GROUP
    _, job = sagemaker_job(demo_config, aws)
    own = f"{job}/algo-1-1764583200"
    theirs = f"{names.training_job_name(VISION, 'r1')}/algo-1-1764583200"
    for action in ("logs:CreateLogGroup", "logs:CreateLogStream", "logs:DescribeLogStreams"):
        assert_allowed(aws, Request(action, log_group_arn(group), role))
    assert_allowed(aws, Request("logs:PutLogEvents", log_stream_arn(group, own), role))
    for stream in (theirs, "someone-elses-job/algo-1-1"):
        assert_refused(aws, Request("logs:PutLogEvents", log_stream_arn(group, stream), role))
    for other in (names.container_log_group(names.cluster_name(DEMO)), "/aws/lambda/anything"):
        assert_refused(aws, Request("logs:PutLogEvents", log_stream_arn(other, own), role))
    for namespace, allowed in ((group, True), (contract.metric_namespace(DEMO), True), ("AWS/EC2", False),
                               (contract.metric_namespace(VISION), False)):  # fmt: skip
        request = Request("cloudwatch:PutMetricData", "*", role, {"cloudwatch:namespace": namespace})
        (assert_allowed if allowed else assert_refused)(aws, request)


def launched_images(aws: Deployment, team: str) -> dict[str, str]:
    """The image each target launches for the bundled smoke job, as deployed: the EKS Job's container image (in its
    manifest) and what `beacon smoke --target sagemaker` hands SageMaker (the cluster stack's SmokeImageUri)."""
    name = stack(team, "cluster")
    template = aws.templates[name]
    (job,) = [i for i, objects in kubernetes_objects(template).items() if any(o["kind"] == "Job" for o in objects)]
    manifest = json.loads(str(aws.resolve(name, template.resources[job]["Properties"]["Manifest"])))
    containers = [c for o in manifest if o["kind"] == "Job" for c in o["spec"]["template"]["spec"]["containers"]]
    (eks_image,) = {c["image"] for c in containers}
    return {"eks": eks_image, "sagemaker": str(aws.resolve(name, template.body["Outputs"]["SmokeImageUri"]["Value"]))}


def repository_of(aws: Deployment, image: str) -> str:
    """The repository ARN an image URI (`<account>.dkr.ecr.<region>.<suffix>/<name>:<tag>`) names, as deployed."""
    registry, _, rest = image.partition("/")
    account, region = registry.split(".")[0], registry.split(".")[3]
    arn = f"arn:aws:ecr:{region}:{account}:repository/{rest.rsplit(':', 1)[0]}"
    held = [aws.arn(name, logical_id) for name, template in aws.templates.items()
            for logical_id in template.of_type("AWS::ECR::Repository")]  # fmt: skip
    assert arn in held, f"{image} names no repository of the deployment ({held})"
    return arn


@pytest.mark.parametrize("team", [DEMO, VISION])
def test_issue25_item2_every_target_launches_a_smoke_image_its_puller_may_pull_and_no_other_team_may(
    aws: Deployment, team: str
) -> None:
    """SageMaker pulls a training image as the job's execution role (the writer), the kubelet with the node's role.
    The smoke image was a CDK asset in the bootstrap's repository, which the writer may not pull; it is published
    into the team's smoke repository, evaluated here with its resource policy, for the exact URI each target gets."""
    images = launched_images(aws, team)
    assert images["eks"] == images["sagemaker"], "one image, one place"
    smoke = repository_of(aws, images["sagemaker"])
    assert smoke.endswith(f":repository/{names.smoke_image_repository(team)}")
    other = VISION if team == DEMO else DEMO
    for target, puller in (("eks", node_role(aws, team)), ("sagemaker", writer(aws, team))):
        for action in PULL_ACTIONS:
            assert_allowed(aws, Request(action, repository_of(aws, images[target]), puller))
        assert_allowed(aws, Request("ecr:GetAuthorizationToken", "*", puller))
    for action in FENCED_ACTIONS:
        assert decide(aws, Request(action, smoke, node_role(aws, other))) is Decision.EXPLICIT_DENY
        assert_refused(aws, Request(action, smoke, writer(aws, other)))
    publisher = f"arn:aws:iam::{ACCOUNT}:role/" + names.cdk_image_publishing_role_name("hnb659fds", ACCOUNT, REGION)
    for action in (*PUSH_ACTIONS, "ecr:BatchCheckLayerAvailability", "ecr:DescribeImages", "ecr:DescribeRepositories"):
        assert_allowed(aws, Request(action, smoke, publisher))  # `cdk deploy` publishes it
    for action in PUSH_ACTIONS:
        assert_refused(aws, Request(action, smoke, writer(aws, team)))


# --- issue 25, items 5-7: principals that trusted too much ----------------------------------------------------------
POD_ROLES = {  # each role a pod takes by Pod Identity: (stack component, logical id prefix, namespace, service account)
    "karpenter": ("cluster", "ClusterControllerServiceAccountRole", "kube-system", "karpenter"),
    "efs-csi": ("cluster", "ClusterEfsCsiRole", manifests.EFS_CSI_NAMESPACE, "efs-csi-controller-sa"),
    "observability": ("cluster", "ClusterObservabilityRole", "amazon-cloudwatch", "cloudwatch-agent"),
    "volume-mount": ("cluster", "TrainingVolumeMountRole", manifests.EFS_CSI_NAMESPACE,
                     manifests.EFS_CSI_NODE_SERVICE_ACCOUNT),
    "writer": ("artifacts", "ArtifactStoreWriterRole", contract.TRAINING_NAMESPACE, manifests.TRAINING_SERVICE_ACCOUNT),
}  # fmt: skip


@pytest.mark.parametrize("role_name", sorted(POD_ROLES))
def test_issue25_item5_a_pod_identity_role_is_handed_out_to_its_own_clusters_service_account_alone(
    aws: Deployment, role_name: str
) -> None:
    """Without session-tag conditions a role trusting pods.eks.amazonaws.com is anyone's who may create a Pod
    Identity association on another cluster of the account (another team's) and pass the role."""
    component, prefix, namespace, service_account = POD_ROLES[role_name]
    role = arn_of(aws, DEMO, component, "AWS::IAM::Role", prefix)
    own = pod_identity_tags(names.cluster_name(DEMO), namespace, service_account)
    assert own["aws:RequestTag/eks-cluster-arn"] == arn_of(aws, DEMO, "cluster", "AWS::EKS::Cluster")
    for action in ("sts:AssumeRole", "sts:TagSession"):
        assert_allowed(aws, Request(action, role, "pods.eks.amazonaws.com", own))
        for foreign in (
            pod_identity_tags(names.cluster_name(VISION), namespace, service_account),  # the other team's cluster
            pod_identity_tags("someone-elses-cluster", namespace, service_account),
            pod_identity_tags(names.cluster_name(DEMO), "default", service_account),
            pod_identity_tags(names.cluster_name(DEMO), namespace, "default"),
            {},
        ):
            assert_refused(aws, Request(action, role, "pods.eks.amazonaws.com", foreign))


def test_issue25_item5_every_role_that_trusts_pod_identity_in_the_app_is_one_of_the_scoped_ones(
    aws: Deployment,
) -> None:
    """A role added later that trusts the Pod Identity service is held to the same rule."""
    trusted = set()
    for name, template in aws.templates.items():
        if not name.startswith(f"beacon-{DEMO}-"):
            continue
        for logical_id, resource in template.of_type("AWS::IAM::Role").items():
            statements = resource["Properties"]["AssumeRolePolicyDocument"]["Statement"]
            if any("pods.eks.amazonaws.com" in json.dumps(s.get("Principal", {})) for s in statements):
                trusted.add((name.rsplit("-", 1)[-1], next(p for p in (v[1] for v in POD_ROLES.values())
                                                            if logical_id.startswith(p))))  # fmt: skip
    assert trusted == {(component, prefix) for component, prefix, _, _ in POD_ROLES.values()}


ASSUME_ANY_ROLE = {
    "Effect": "Allow",
    "Action": "sts:AssumeRole",
    "Resource": "*",
}  # an account's operators often have it


def take_reader(aws: Deployment, team: str, principal: str, **tags: str) -> Decision:
    """Whether `principal` (a role outside the templates, allowed sts:AssumeRole on every role by its own policy)
    may take `team`'s reader role, carrying principal tags `tags`."""
    request = Request(
        "sts:AssumeRole", reader(aws, team), principal, {f"aws:PrincipalTag/{k}": v for k, v in tags.items()}
    )
    extra = [PolicyDoc.of(PolicyKind.IDENTITY, {"Statement": [ASSUME_ANY_ROLE]}, "its own policy")]
    return explain(aws.policies_for(request) + extra, request).decision


def test_issue25_item6_the_reader_is_taken_by_the_roles_the_team_file_names_else_by_its_tagged_roles_alone(
    aws: Deployment,
) -> None:
    """The reader trusted the account root: anyone allowed sts:AssumeRole on * (another team's operators) read every
    run, the team's container logs and its training jobs. A team that names its roles (vision) trusts them alone; one
    that names none (demo) trusts roles tagged with its reader tag."""
    someone = f"arn:aws:iam::{ACCOUNT}:role/another-teams-operator"
    assert take_reader(aws, DEMO, someone) is not Decision.ALLOW, "the account's roles are not readers by default"
    assert take_reader(aws, DEMO, someone, **{names.reader_tag(DEMO): "true"}) is Decision.ALLOW
    for tags in ({names.reader_tag(VISION): "true"}, {names.reader_tag(DEMO): "false"}):
        assert take_reader(aws, DEMO, someone, **tags) is not Decision.ALLOW, tags
    for named in (VISION_OPERATOR, VISION_READER):  # the team file's roles, by name: their own policy aside
        assert_allowed(aws, Request("sts:AssumeRole", reader(aws, VISION), named))
        assert take_reader(aws, DEMO, named) is not Decision.ALLOW, "another team's named reader reads nothing of ours"
    tagged = take_reader(aws, VISION, someone, **{names.reader_tag(VISION): "true"})
    assert tagged is not Decision.ALLOW, "a team that names its readers trusts no tag"


def test_issue25_item10_the_log_group_keeper_touches_its_clusters_container_insights_groups_alone(
    aws: Deployment,
) -> None:
    """CDK's SDK-call function creates (or adopts) the add-on's Container Insights groups and sets their retention:
    those four of this team's cluster, nothing else."""
    name = stack(DEMO, "cluster")
    role = aws.arn(name, aws.find(name, "AWS::IAM::Role", "AWS679f53fac002430cb0da5b7982bd2287"))
    own = names.container_insights_log_groups(names.cluster_name(DEMO))
    for group in own:
        for action in ("logs:CreateLogGroup", "logs:PutRetentionPolicy"):
            assert_allowed(aws, Request(action, log_group_arn(group), role))
    for group in (*names.container_insights_log_groups(names.cluster_name(VISION)), "/aws/lambda/anything"):
        assert_refused(aws, Request("logs:PutRetentionPolicy", log_group_arn(group), role))
    for action in ("logs:DeleteLogGroup", "logs:DeleteRetentionPolicy", "logs:GetLogEvents"):
        assert_refused(aws, Request(action, log_group_arn(own[0]), role))
