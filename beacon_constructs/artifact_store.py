"""The artifact store: a versioned, KMS-encrypted bucket and the roles that may use it."""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import ArnFormat, Aws, Duration, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from beacon import contract
from constructs import Construct

from beacon_constructs.nag import acknowledge, nag_arn
from beacon_constructs.pod_identity import pod_identity_statement
from beacon_constructs.tagging import tag_component

WRITER_OBJECT_ACTIONS = ("s3:PutObject", "s3:GetObject")
READER_OBJECT_ACTIONS = ("s3:GetObject", "s3:GetObjectVersion")
VERDICT_OBJECT_ACTIONS = ("s3:GetObject",)
READER_CLOUDWATCH_ACTIONS = (
    "cloudwatch:GetMetricData",
    "cloudwatch:GetMetricStatistics",
    "cloudwatch:ListMetrics",
    "cloudwatch:DescribeAlarms",
)
DELETE_ACTIONS = ("s3:DeleteObject", "s3:DeleteObjectVersion")
# The doctor's reading of a job's container logs (beacon_ops/doctor/log_reader.py): what each call needs.
READER_CLUSTER_LOG_ACTIONS = ("logs:FilterLogEvents", "logs:GetLogEvents", "logs:DescribeLogStreams")
READER_TRAINING_JOB_ACTIONS = ("sagemaker:DescribeTrainingJob",)


class ArtifactStore(Construct):
    """Bucket, access-log bucket, KMS key, a least-privilege writer and a read-only reader.

    The writer is the training job's identity (EKS Pod Identity or SageMaker). It may create
    and read objects under ``experiments/`` only, never delete, and never overwrite history:
    the bucket policy refuses any write to an append-only prefix that is not a conditional create.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        noncurrent_version_retention: Duration,
        abort_incomplete_multipart_after: Duration,
        metric_namespace: str,
        cluster_name: str,
        training_namespace: str,
        training_service_account: str,
        cluster_log_group: str,
        training_job_log_group: str,
        training_job_prefix: str,
        reader_role_arns: Sequence[str],
        reader_tag: str,
        removal_policy: RemovalPolicy = RemovalPolicy.RETAIN,
    ) -> None:
        super().__init__(scope, construct_id)
        tag_component(self, "artifact-store")

        self.key = kms.Key(
            self,
            "Key",
            description="Beacon artifact store: training records, checkpoints and event files",
            enable_key_rotation=True,
            removal_policy=removal_policy,
        )
        self.logs_bucket = s3.Bucket(
            self,
            "AccessLogs",
            encryption=s3.BucketEncryption.S3_MANAGED,  # log delivery supports SSE-S3 only
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            enforce_ssl=True,
            versioned=True,
            removal_policy=removal_policy,
        )
        self.bucket = s3.Bucket(
            self,
            "Bucket",
            versioned=True,
            encryption=s3.BucketEncryption.KMS,
            encryption_key=self.key,
            bucket_key_enabled=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            enforce_ssl=True,
            server_access_logs_bucket=self.logs_bucket,
            server_access_logs_prefix="artifacts/",
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="expire-noncurrent-versions",
                    noncurrent_version_expiration=noncurrent_version_retention,
                    abort_incomplete_multipart_upload_after=abort_incomplete_multipart_after,
                )
            ],
            removal_policy=removal_policy,
        )
        self._deny_overwriting_history()

        stack = Stack.of(self)
        # SageMaker may hand out the writer only to this team's training jobs (named with its prefix) of this account
        sagemaker = iam.ServicePrincipal("sagemaker.amazonaws.com").with_conditions(
            {
                "StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID},
                "ArnLike": {
                    "aws:SourceArn": stack.format_arn(
                        service="sagemaker", resource="training-job", resource_name=f"{training_job_prefix}*"
                    )
                },
            }
        )
        self.writer_role = iam.Role(
            self,
            "WriterRole",
            description="Beacon training jobs: write records and checkpoints under experiments/",
            assumed_by=sagemaker,
            max_session_duration=Duration.hours(12),
        )
        # EKS Pod Identity needs TagSession as well as AssumeRole. Its session tags name the cluster,
        # namespace and service account: only this team's training pods may take the role.
        self.writer_role.assume_role_policy.add_statements(  # type: ignore[union-attr]
            pod_identity_statement(
                self,
                cluster_name=cluster_name,
                namespace=training_namespace,
                service_account=training_service_account,
            )
        )
        self.writer_policy = iam.Policy(
            self,
            "WriterPolicy",
            roles=[self.writer_role],
            statements=[
                iam.PolicyStatement(
                    sid="ReadWriteExperiments",
                    actions=list(WRITER_OBJECT_ACTIONS),
                    resources=[self.experiments_arn],
                ),
                self._list_experiments_statement("ListExperiments"),
                self._key_via_s3_statement("UseKeyViaS3", ["kms:GenerateDataKey", "kms:Decrypt"]),
                # A SageMaker job's output is encrypted with OutputDataConfig.KmsKeyId (this key), and SageMaker's
                # API reference asks the execution role (this role) for kms:Encrypt on it. Encrypt decrypts nothing.
                iam.PolicyStatement(
                    sid="EncryptSageMakerOutput", actions=["kms:Encrypt"], resources=[self.key.key_arn]
                ),
                iam.PolicyStatement(
                    sid="PutBeaconMetrics",
                    actions=["cloudwatch:PutMetricData"],
                    resources=["*"],  # PutMetricData has no resource type; the namespace scopes it
                    # the team's, and the one SageMaker publishes a training job's MetricDefinitions under, as
                    # the job's execution role (this role)
                    conditions={"StringEquals": {"cloudwatch:namespace": [metric_namespace, training_job_log_group]}},
                ),
                *self._training_job_log_writes(training_job_log_group, training_job_prefix),
            ],
        )
        # Belt and braces: even a later, broader grant cannot make the writer delete history.
        self.bucket.add_to_resource_policy(
            iam.PolicyStatement(
                sid="WriterNeverDeletes",
                effect=iam.Effect.DENY,
                actions=list(DELETE_ACTIONS),
                principals=[iam.ArnPrincipal(self.writer_role.role_arn)],
                resources=[self.bucket.arn_for_objects("*")],
            )
        )

        # Not the account root: another team's operators (anyone allowed sts:AssumeRole on *) would read every run,
        # the team's container logs and its training jobs. The roles the team file names; a team that names none,
        # roles of the account tagged with its reader tag (weaker: a session tag satisfies aws:PrincipalTag too, so
        # whoever may tag a session they take can read; name the roles to close that).
        tagged = iam.AccountRootPrincipal().with_conditions(
            {"StringEquals": {f"aws:PrincipalTag/{reader_tag}": "true"}}
        )
        named = [iam.ArnPrincipal(arn) for arn in reader_role_arns]
        self.reader_role = iam.Role(
            self,
            "ReaderRole",
            description="People and dashboards: read and list Beacon artifacts",
            assumed_by=iam.CompositePrincipal(*named) if named else tagged,
        )
        self.reader_policy = iam.Policy(
            self,
            "ReaderPolicy",
            roles=[self.reader_role],
            statements=[
                iam.PolicyStatement(
                    sid="ReadExperiments",
                    actions=list(READER_OBJECT_ACTIONS),
                    resources=[self.experiments_arn],
                ),
                self._list_experiments_statement("ListExperiments", versions=True),
                iam.PolicyStatement(
                    sid="ConfirmVersioning",  # `beacon smoke` proves history is kept
                    actions=["s3:GetBucketVersioning"],
                    resources=[self.bucket.bucket_arn],
                ),
                self._key_via_s3_statement("DecryptViaS3", ["kms:Decrypt"]),
                iam.PolicyStatement(
                    sid="ReadMetricsAndAlarms",
                    actions=list(READER_CLOUDWATCH_ACTIONS),
                    resources=["*"],  # CloudWatch read APIs have no resource type (but DescribeAlarms)
                ),
                *self._job_log_statements(cluster_log_group, training_job_log_group, training_job_prefix),
            ],
        )

        # The monitoring stack's alarm-verdict function: it reads a run's evidence here, and the monitoring
        # stack grants it the rest (its topic, its logs, the team's alarms), as it grants the writer its alarms.
        # The alarm's function runs as `verdict_role`, which reads nothing in the bucket itself: for each alarm it
        # takes `verdict_reader_role` in a session whose policy (beacon_ops.doctor.notify.run_session_policy)
        # narrows these rights to the alarmed run's evidence, so a diagnosis can read that run and no other.
        self.verdict_role = iam.Role(
            self,
            "VerdictRole",
            description="Beacon alarm verdict function: takes the reader role scoped to the alarmed run",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
        )
        self.verdict_reader_role = iam.Role(
            self,
            "VerdictReaderRole",
            description="Beacon alarm verdict function's reading: what a diagnosis reads of a run, one run a session",
            assumed_by=iam.ArnPrincipal(self.verdict_role.role_arn),
            max_session_duration=Duration.hours(1),
        )
        self.verdict_policy = iam.Policy(
            self,
            "VerdictPolicy",
            roles=[self.verdict_role],
            statements=[
                iam.PolicyStatement(
                    sid="TakeTheReaderRoleForOneRun",
                    actions=["sts:AssumeRole"],
                    resources=[self.verdict_reader_role.role_arn],
                )
            ],
        )
        self.verdict_reader_policy = iam.Policy(
            self,
            "VerdictReaderPolicy",
            roles=[self.verdict_reader_role],
            statements=[
                iam.PolicyStatement(
                    sid="ReadRunEvidence",
                    actions=list(VERDICT_OBJECT_ACTIONS),
                    # a diagnosis reads these kinds of a run, never its model (checkpoints) or its TensorBoard
                    resources=[
                        self.bucket.arn_for_objects(f"{contract.EXPERIMENTS_PREFIX}*/*/{kind}/*")
                        for kind in contract.DIAGNOSED_KINDS
                    ],
                ),
                self._list_experiments_statement("ListRunEvidence"),
                self._key_via_s3_statement("DecryptViaS3", ["kms:Decrypt"]),
            ],
        )

        self._acknowledge_findings()
        self._acknowledge_job_log_findings(cluster_log_group, training_job_log_group, training_job_prefix)

    def _log_group_arn(self, group: str, suffix: str = "") -> str:
        return Stack.of(self).format_arn(
            service="logs",
            resource="log-group",
            resource_name=f"{group}{suffix}",
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )

    def _job_log_statements(
        self, cluster_log_group: str, training_job_log_group: str, training_job_prefix: str
    ) -> list[iam.PolicyStatement]:
        """What `beacon doctor` reads of a job beside its evidence: the cluster's own container-log group, whole;
        in the account's SageMaker group only the team's jobs' streams; the team's jobs' descriptions.

        FilterLogEvents and DescribeLogStreams take a log group as their only resource; GetLogEvents a stream.
        So in the shared SageMaker group the reader may list stream names (DescribeLogStreams: names and times,
        no line of any log) to find its jobs' `<job>/algo-<n>-<t>`, and read lines only of streams under its
        prefix; FilterLogEvents there would read every team's lines, and is not granted."""
        sagemaker_group = self._log_group_arn(training_job_log_group)
        return [
            iam.PolicyStatement(
                sid="ReadClusterContainerLogs",
                actions=list(READER_CLUSTER_LOG_ACTIONS),
                # The group's ARN as IAM matches it for group actions, with and without the ":*" AWS appends.
                resources=[self._log_group_arn(cluster_log_group), self._log_group_arn(cluster_log_group, ":*")],
            ),
            iam.PolicyStatement(
                sid="ListTrainingJobLogStreams",
                actions=["logs:DescribeLogStreams"],
                resources=[sagemaker_group, f"{sagemaker_group}:*"],
            ),
            iam.PolicyStatement(
                sid="ReadOwnTrainingJobLogs",
                actions=["logs:GetLogEvents"],
                resources=[f"{sagemaker_group}:log-stream:{training_job_prefix}*"],
            ),
            iam.PolicyStatement(
                sid="DescribeOwnTrainingJobs",
                actions=list(READER_TRAINING_JOB_ACTIONS),
                resources=[
                    Stack.of(self).format_arn(
                        service="sagemaker", resource="training-job", resource_name=f"{training_job_prefix}*"
                    )
                ],
            ),
        ]

    def _training_job_log_writes(
        self, training_job_log_group: str, training_job_prefix: str
    ) -> list[iam.PolicyStatement]:
        """What SageMaker does as a training job's execution role (CreateTrainingJob's RoleArn): it writes the
        container's output to the account's `/aws/sagemaker/TrainingJobs` group, a stream per instance named after
        the job. CreateLogGroup, CreateLogStream and DescribeLogStreams take the group as their resource (a stream
        created empty in the shared group holds nothing); PutLogEvents takes the stream: the team's jobs' alone."""
        group = self._log_group_arn(training_job_log_group)
        return [
            iam.PolicyStatement(
                sid="SageMakerJobLogStreams",
                actions=["logs:CreateLogGroup", "logs:CreateLogStream", "logs:DescribeLogStreams"],
                resources=[group, f"{group}:*"],
            ),
            iam.PolicyStatement(
                sid="SageMakerWritesOwnJobLogs",
                actions=["logs:PutLogEvents"],
                resources=[f"{group}:log-stream:{training_job_prefix}*"],
            ),
        ]

    @property
    def experiments_arn(self) -> str:
        return self.bucket.arn_for_objects(f"{contract.EXPERIMENTS_PREFIX}*")

    def _list_experiments_statement(self, sid: str, *, versions: bool = False) -> iam.PolicyStatement:
        actions = ["s3:ListBucket"] + (["s3:ListBucketVersions"] if versions else [])
        return iam.PolicyStatement(
            sid=sid,
            actions=actions,
            resources=[self.bucket.bucket_arn],
            conditions={"StringLike": {"s3:prefix": [contract.EXPERIMENTS_PREFIX, f"{contract.EXPERIMENTS_PREFIX}*"]}},
        )

    def _key_via_s3_statement(self, sid: str, actions: list[str]) -> iam.PolicyStatement:
        return iam.PolicyStatement(
            sid=sid,
            actions=actions,
            resources=[self.key.key_arn],
            conditions={"StringEquals": {"kms:ViaService": f"s3.{Aws.REGION}.amazonaws.com"}},
        )

    def _acknowledge_findings(self) -> None:
        bucket_id = Stack.of(self).resolve(Stack.of(self).get_logical_id(self.bucket.node.default_child))  # type: ignore[arg-type]
        prefix_finding = f"IAM5[Resource::<{bucket_id}.Arn>/{contract.EXPERIMENTS_PREFIX}*]"
        for policy in (self.writer_policy, self.reader_policy):
            acknowledge(
                policy,
                prefix_finding,
                "Runs create keys at run time; the grant is limited to the experiments/ prefix of this bucket.",
            )
        for kind in contract.DIAGNOSED_KINDS:
            acknowledge(
                self.verdict_reader_policy,
                f"IAM5[Resource::<{bucket_id}.Arn>/{contract.EXPERIMENTS_PREFIX}*/*/{kind}/*]",
                f"Runs create keys at run time; a session reads one run's {kind}/ objects alone (its session policy).",
            )
        acknowledge(
            self.reader_policy,
            "IAM5[Resource::*]",
            "CloudWatch metric reads have no resource type; the reader only reads, for `beacon doctor` and dashboards.",
        )
        acknowledge(
            self.writer_policy,
            "IAM5[Resource::*]",
            "cloudwatch:PutMetricData has no resource type; the cloudwatch:namespace condition limits it to the team's "
            "namespace and the one SageMaker publishes training-job metric definitions under.",
        )

    def _acknowledge_job_log_findings(
        self, cluster_log_group: str, training_job_log_group: str, training_job_prefix: str
    ) -> None:
        stack = Stack.of(self)
        reasons = {
            nag_arn(stack, "logs", "log-group", f"{cluster_log_group}:*"): (
                "The team's own cluster's container-log group, as IAM names a log group for FilterLogEvents and "
                "DescribeLogStreams; its streams are created per container at run time."
            ),
            nag_arn(stack, "logs", "log-group", f"{training_job_log_group}:*"): (
                "DescribeLogStreams only (stream names and times, no log line): the reader finds its team's "
                "training-job streams in the account-wide SageMaker group by their name prefix."
            ),
            nag_arn(stack, "logs", "log-group", f"{training_job_log_group}:log-stream:{training_job_prefix}*"): (
                "GetLogEvents on the streams of the team's own training jobs only: SageMaker names them after "
                "the job, and every job of the team carries the team's prefix."
            ),
            nag_arn(stack, "sagemaker", "training-job", f"{training_job_prefix}*", separator="/"): (
                "DescribeTrainingJob on the team's own training jobs only, named with the team's prefix at run time."
            ),
        }
        for arn, reason in reasons.items():
            acknowledge(self.reader_policy, f"IAM5[Resource::{arn}]", reason)
        writes = {
            nag_arn(stack, "logs", "log-group", f"{training_job_log_group}:*"): (
                "SageMaker creates the account's training-job log group and a stream per instance in it as the job's "
                "execution role; CreateLogStream takes the group as its resource, and an empty stream holds nothing."
            ),
            nag_arn(stack, "logs", "log-group", f"{training_job_log_group}:log-stream:{training_job_prefix}*"): (
                "SageMaker writes a training job's output as its execution role into streams named after the job: "
                "PutLogEvents on the team's own jobs' streams only."
            ),
        }
        for arn, reason in writes.items():
            acknowledge(self.writer_policy, f"IAM5[Resource::{arn}]", reason)

    def _deny_overwriting_history(self) -> None:
        # A list of exemptions, not of protected prefixes: IAM's * crosses '/', so a protected
        # experiments/*/*/events/* would also catch SageMaker's sync of .../sagemaker-volume/.../events/.
        # Multipart parts carry no conditional header; ObjectCreationOperation exempts them.
        self.bucket.add_to_resource_policy(
            iam.PolicyStatement(
                sid="HistoryIsCreateOnly",
                effect=iam.Effect.DENY,
                actions=["s3:PutObject"],
                principals=[iam.AnyPrincipal()],
                not_resources=[self.bucket.arn_for_objects(p) for p in contract.overwritable_resource_patterns()],
                conditions={
                    "StringNotEquals": {"s3:if-none-match": "*"},
                    "Bool": {"s3:ObjectCreationOperation": "true"},
                },
            )
        )
