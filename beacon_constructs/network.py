"""The private network: nodes in private subnets, NAT only for what has no endpoint, and VPC
endpoints so training traffic to AWS never leaves the region or crosses NAT."""

from __future__ import annotations

from aws_cdk import Tags
from aws_cdk import aws_ec2 as ec2
from constructs import Construct

from beacon_constructs.log_groups import log_group
from beacon_constructs.tagging import tag_component

KARPENTER_DISCOVERY_TAG = "karpenter.sh/discovery"
NODE_SUBNETS = "Nodes"
# config/model.py validates vpc_cidr against this layout (NAT_SUBNET_MASK, NODE_SUBNET_MASK).
NAT_SUBNET_MASK = 24
NODE_SUBNET_MASK = 19

# What a training job and its node talk to: metrics, logs, credentials, images, the interruption
# queue, Pod Identity, the volume, and the run-alarm template.
TRAINING_ENDPOINTS = {
    "CloudWatchMonitoring": ec2.InterfaceVpcEndpointAwsService.CLOUDWATCH_MONITORING,
    "CloudWatchLogs": ec2.InterfaceVpcEndpointAwsService.CLOUDWATCH_LOGS,
    "Sts": ec2.InterfaceVpcEndpointAwsService.STS,
    "EcrApi": ec2.InterfaceVpcEndpointAwsService.ECR,
    "EcrDocker": ec2.InterfaceVpcEndpointAwsService.ECR_DOCKER,
    "Sqs": ec2.InterfaceVpcEndpointAwsService.SQS,
    "EksAuth": ec2.InterfaceVpcEndpointAwsService.EKS_AUTH,
    "Efs": ec2.InterfaceVpcEndpointAwsService.ELASTIC_FILESYSTEM,
    "Ssm": ec2.InterfaceVpcEndpointAwsService.SSM,
}
# What Karpenter and node management call (Karpenter's private-cluster list adds ec2 and eks;
# Session Manager needs ssmmessages and ec2messages): without them scale-up rides one NAT gateway.
PLATFORM_ENDPOINTS = {
    "Ec2": ec2.InterfaceVpcEndpointAwsService.EC2,
    "Eks": ec2.InterfaceVpcEndpointAwsService.EKS,
    "SsmMessages": ec2.InterfaceVpcEndpointAwsService.SSM_MESSAGES,
    "Ec2Messages": ec2.InterfaceVpcEndpointAwsService.EC2_MESSAGES,
}
# The endpoints every network has; the platform ones are those a team may opt out of
# (`extra_endpoints = false`, the lean profile): without them those calls ride the NAT gateway.
INTERFACE_ENDPOINTS = TRAINING_ENDPOINTS
EXTRA_INTERFACE_ENDPOINTS = PLATFORM_ENDPOINTS


class TrainingNetwork(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cidr: str,
        az_count: int,
        availability_zones: list[str] | None,
        extra_endpoints: bool,
        cluster_name: str,
        flow_log_retention_days: int,
    ) -> None:
        super().__init__(scope, construct_id)
        tag_component(self, "network")
        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(cidr),
            # Named for a stack with an account, so synth needs no AZ lookup; an env-agnostic stack
            # resolves its first az_count at deploy time.
            availability_zones=availability_zones,
            max_azs=None if availability_zones else az_count,
            nat_gateways=1,  # image pulls from public registries only; AWS traffic uses endpoints
            subnet_configuration=[
                ec2.SubnetConfiguration(name="Nat", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=NAT_SUBNET_MASK),
                ec2.SubnetConfiguration(
                    name=NODE_SUBNETS, subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS, cidr_mask=NODE_SUBNET_MASK
                ),
            ],
        )
        self.flow_logs = log_group(self, "FlowLogs", retention_days=flow_log_retention_days)
        self.vpc.add_flow_log("FlowLog", destination=ec2.FlowLogDestination.to_cloud_watch_logs(self.flow_logs))
        self.node_subnets = ec2.SubnetSelection(subnet_group_name=NODE_SUBNETS)
        for subnet in self.vpc.select_subnets(subnet_group_name=NODE_SUBNETS).subnets:
            Tags.of(subnet).add(KARPENTER_DISCOVERY_TAG, cluster_name)
            Tags.of(subnet).add("kubernetes.io/role/internal-elb", "1")

        # Nodes Karpenter launches; the file system admits NFS from this group only.
        self.node_security_group = ec2.SecurityGroup(
            self, "TrainingNodes", vpc=self.vpc, description="Beacon training nodes (Karpenter)"
        )
        Tags.of(self.node_security_group).add(KARPENTER_DISCOVERY_TAG, cluster_name)
        self.node_security_group.add_ingress_rule(
            self.node_security_group, ec2.Port.all_traffic(), "nodes and pods talk to each other (NCCL, DNS)"
        )

        self.endpoint_security_group = ec2.SecurityGroup(
            self,
            "Endpoints",
            vpc=self.vpc,
            description="Beacon VPC endpoints: HTTPS from the VPC only",
            allow_all_outbound=False,
        )
        self.endpoint_security_group.add_ingress_rule(
            ec2.Peer.ipv4(cidr), ec2.Port.tcp(443), "HTTPS from inside the VPC"
        )
        self.gateway_endpoints = {
            "S3": self.vpc.add_gateway_endpoint(
                "S3", service=ec2.GatewayVpcEndpointAwsService.S3, subnets=[self.node_subnets]
            )
        }
        self.interface_endpoints = {
            name: self.vpc.add_interface_endpoint(
                name,
                service=service,
                subnets=self.node_subnets,
                security_groups=[self.endpoint_security_group],
                open=False,
                private_dns_enabled=True,
            )
            for name, service in {
                **INTERFACE_ENDPOINTS,
                **(EXTRA_INTERFACE_ENDPOINTS if extra_endpoints else {}),
            }.items()
        }
