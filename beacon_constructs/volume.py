"""The persistent artifact volume: EFS with an access point that owns every write as the training
uid/gid. That, not a chown at start-up, keeps writes working when the pod's fsGroup is wrong
or ignored (a volume its training uid cannot write)."""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_efs as efs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from constructs import Construct

from beacon_constructs.tagging import tag_component

ACCESS_POINT_PATH = "/training"
ACCESS_POINT_PERMISSIONS = "750"  # owner writes, group reads; never 777
NFS_PORT = 2049
# Mount and write; never ClientRootAccess: the access point makes every write the training uid.
CLIENT_ACTIONS = ("elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite")


class ArtifactVolume(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        vpc: ec2.IVpc,
        subnets: ec2.SubnetSelection,
        client_security_group: ec2.ISecurityGroup,
        uid: int,
        gid: int,
        removal_policy: RemovalPolicy = RemovalPolicy.RETAIN,
    ) -> None:
        super().__init__(scope, construct_id)
        tag_component(self, "artifact-volume")
        self.uid, self.gid = uid, gid
        self.key = kms.Key(
            self, "Key", description="Beacon artifact volume", enable_key_rotation=True, removal_policy=removal_policy
        )
        self.security_group = ec2.SecurityGroup(
            self,
            "SecurityGroup",
            vpc=vpc,
            description="Beacon artifact volume: NFS from training nodes only",
            allow_all_outbound=False,
        )
        self.security_group.add_ingress_rule(client_security_group, ec2.Port.tcp(NFS_PORT), "NFS from training nodes")
        self.file_system = efs.FileSystem(
            self,
            "FileSystem",
            vpc=vpc,
            vpc_subnets=subnets,
            security_group=self.security_group,
            encrypted=True,
            kms_key=self.key,
            enable_automatic_backups=True,
            lifecycle_policy=efs.LifecyclePolicy.AFTER_30_DAYS,
            out_of_infrequent_access_policy=efs.OutOfInfrequentAccessPolicy.AFTER_1_ACCESS,
            performance_mode=efs.PerformanceMode.GENERAL_PURPOSE,
            throughput_mode=efs.ThroughputMode.ELASTIC,
            # Not "anyone may mount": this only keeps CDK's default statement (write and root for
            # any client, no mount) out of the policy. Ours below admits IAM identities of this
            # account, over TLS through an access point; no statement admits an anonymous client.
            allow_anonymous_access=True,
            removal_policy=removal_policy,
        )
        self._admit_iam_clients_over_tls()
        self.access_point = self.file_system.add_access_point(
            "TrainingAccessPoint",
            path=ACCESS_POINT_PATH,
            posix_user=efs.PosixUser(uid=str(uid), gid=str(gid)),
            create_acl=efs.Acl(owner_uid=str(uid), owner_gid=str(gid), permissions=ACCESS_POINT_PERMISSIONS),
        )

    def _admit_iam_clients_over_tls(self) -> None:
        # The account principal delegates to identity policies: a client mounts only if its own
        # role grants ClientMount (the EFS CSI driver's node role does, for the access point).
        self.file_system.add_to_resource_policy(
            iam.PolicyStatement(
                sid="MountThroughAccessPointOverTls",
                actions=list(CLIENT_ACTIONS),
                principals=[iam.AccountRootPrincipal()],
                conditions={
                    "Bool": {"elasticfilesystem:AccessedViaMountTarget": "true", "aws:SecureTransport": "true"},
                    "Null": {"elasticfilesystem:AccessPointArn": "false"},
                },
            )
        )
        self.file_system.add_to_resource_policy(
            iam.PolicyStatement(
                sid="DenyWithoutTls",
                effect=iam.Effect.DENY,
                actions=["elasticfilesystem:*"],
                principals=[iam.AnyPrincipal()],
                conditions={"Bool": {"aws:SecureTransport": "false"}},
            )
        )
