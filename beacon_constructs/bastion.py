"""An optional, SSM-managed bastion: the way to reach the private cluster endpoint from a laptop.

It has no SSH, no public address and no inbound rule: Session Manager port forwarding
(AWS-StartPortForwardingSessionToRemoteHost) carries `beacon smoke`'s HTTPS to the API endpoint.
"""

from __future__ import annotations

from aws_cdk import Acknowledgment, Validations
from aws_cdk import aws_ec2 as ec2
from constructs import Construct

from beacon_constructs.nag import acknowledge
from beacon_constructs.tagging import tag_component

BASTION_INSTANCE_TYPE = "t3.nano"


class ClusterBastion(Construct):
    """A tiny instance in the node subnets; let it reach the API with `cluster.connections.allow_from`."""

    def __init__(self, scope: Construct, construct_id: str, *, vpc: ec2.IVpc, subnets: ec2.SubnetSelection) -> None:
        super().__init__(scope, construct_id)
        tag_component(self, "bastion")
        self.host = ec2.BastionHostLinux(
            self,
            "Host",
            vpc=vpc,
            subnet_selection=subnets,
            instance_type=ec2.InstanceType(BASTION_INSTANCE_TYPE),
            require_imdsv2=True,
            block_devices=[
                ec2.BlockDevice(device_name="/dev/xvda", volume=ec2.BlockDeviceVolume.ebs(8, encrypted=True))
            ],
        )
        self.connections = self.host.connections
        ssm_agent = "CDK's BastionHostLinux grants the SSM agent its session channels; they name no resource ARNs."
        for finding in ("IAM5[Action::ssmmessages:*]", "IAM5[Action::ec2messages:*]", "IAM5[Resource::*]"):
            acknowledge(self, finding, ssm_agent)
        Validations.of(self).acknowledge(
            Acknowledgment(
                id="CloudFormation-Validate::W3010",
                reason="The team file names the AZs, so synth needs no lookup; the bastion takes the first node AZ.",
            )
        )
        acknowledge(
            self,
            "EC28",
            "A port-forwarding relay with no workload of its own: basic monitoring is enough.",
        )
        acknowledge(
            self,
            "EC29",
            "Stateless and replaceable: turning `bastion` off in the team file must delete it.",
        )
