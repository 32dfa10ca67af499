"""The persistent artifact volume: EFS with an access point that owns every write as the training
uid/gid. That, not a chown at start-up, keeps writes working when the pod's fsGroup is wrong
or ignored (a volume its training uid cannot write)."""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_efs as efs
from aws_cdk import aws_kms as kms
from constructs import Construct

from beacon_constructs.tagging import tag_component

ACCESS_POINT_PATH = "/training"
ACCESS_POINT_PERMISSIONS = "750"  # owner writes, group reads; never 777
NFS_PORT = 2049


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
            removal_policy=removal_policy,
        )
        self.access_point = self.file_system.add_access_point(
            "TrainingAccessPoint",
            path=ACCESS_POINT_PATH,
            posix_user=efs.PosixUser(uid=str(uid), gid=str(gid)),
            create_acl=efs.Acl(owner_uid=str(uid), owner_gid=str(gid), permissions=ACCESS_POINT_PERMISSIONS),
        )
