"""The network stack: private nodes, NAT only in public subnets, flow logs, and in-region endpoints."""

from __future__ import annotations

from typing import Any

import pytest
from aws_cdk.assertions import Match, Template

from tests.support.synth import Synthesized


@pytest.fixture(scope="module")
def template(demo: Synthesized) -> Template:
    return demo.assertions("beacon-demo-network")


def subnets(demo: Synthesized) -> dict[str, dict[str, Any]]:
    return demo.template("network").of_type("AWS::EC2::Subnet")


def tags(resource: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in resource["Properties"].get("Tags", [])}


def test_vpc_uses_the_configured_cidr_and_az_count(template: Template, demo: Synthesized) -> None:
    template.has_resource_properties("AWS::EC2::VPC", {"CidrBlock": demo.config.network.vpc_cidr})
    kinds = [tags(s)["aws-cdk:subnet-type"] for s in subnets(demo).values()]
    assert sorted(kinds) == ["Private"] * demo.config.network.az_count + ["Public"] * demo.config.network.az_count


def test_private_subnets_are_tagged_for_karpenter_discovery_and_public_ones_are_not(demo: Synthesized) -> None:
    for subnet in subnets(demo).values():
        subnet_tags = tags(subnet)
        if subnet_tags["aws-cdk:subnet-type"] == "Private":
            assert subnet_tags["karpenter.sh/discovery"] == "beacon-demo"
            assert subnet["Properties"]["MapPublicIpOnLaunch"] is False
        else:
            assert "karpenter.sh/discovery" not in subnet_tags


def test_nat_lives_only_in_a_public_subnet(demo: Synthesized) -> None:
    (nat,) = demo.template("network").of_type("AWS::EC2::NatGateway").values()
    subnet_id = nat["Properties"]["SubnetId"]["Ref"]
    assert tags(subnets(demo)[subnet_id])["aws-cdk:subnet-type"] == "Public"


def test_flow_logs_go_to_a_log_group_with_the_configured_retention(template: Template, demo: Synthesized) -> None:
    template.has_resource_properties(
        "AWS::EC2::FlowLog", {"ResourceType": "VPC", "TrafficType": "ALL", "LogDestinationType": "cloud-watch-logs"}
    )
    template.has_resource_properties(
        "AWS::Logs::LogGroup", {"RetentionInDays": demo.config.monitoring.log_retention_days}
    )


EXPECTED_INTERFACE_SERVICES = {
    "monitoring",
    "logs",
    "sts",
    "ecr.api",
    "ecr.dkr",
    "sqs",
    "eks-auth",
    "elasticfilesystem",
    "ssm",
    # Karpenter's private-cluster list and Session Manager (issue 11, item 8)
    "ec2",
    "eks",
    "ssmmessages",
    "ec2messages",
}


def endpoint_service(endpoint: dict[str, Any]) -> str:
    name = endpoint["Properties"]["ServiceName"]
    if isinstance(name, str):
        return name.rsplit(".", 1)[-1] if "ecr" not in name else ".".join(name.split(".")[-2:])
    parts = name["Fn::Join"][1]
    return str(parts[-1]).lstrip(".")


def test_training_traffic_to_aws_has_an_endpoint_for_every_service_it_uses(demo: Synthesized) -> None:
    endpoints = list(demo.template("network").of_type("AWS::EC2::VPCEndpoint").values())
    gateways = [e for e in endpoints if e["Properties"].get("VpcEndpointType") == "Gateway"]
    interfaces = [e for e in endpoints if e["Properties"].get("VpcEndpointType") == "Interface"]
    assert len(gateways) == 1 and "s3" in str(gateways[0]["Properties"]["ServiceName"])
    assert {endpoint_service(e) for e in interfaces} == EXPECTED_INTERFACE_SERVICES
    for endpoint in interfaces:
        assert endpoint["Properties"]["PrivateDnsEnabled"] is True


def test_endpoint_security_group_admits_only_https_from_the_vpc(template: Template, demo: Synthesized) -> None:
    template.has_resource_properties(
        "AWS::EC2::SecurityGroup",
        {
            "GroupDescription": Match.string_like_regexp("VPC endpoints"),
            "SecurityGroupIngress": [
                {
                    "CidrIp": demo.config.network.vpc_cidr,
                    "FromPort": 443,
                    "ToPort": 443,
                    "IpProtocol": "tcp",
                    "Description": Match.any_value(),
                }
            ],
        },
    )


def test_training_nodes_security_group_is_tagged_for_karpenter(demo: Synthesized) -> None:
    groups = demo.template("network").of_type("AWS::EC2::SecurityGroup")
    nodes = [g for g in groups.values() if "training nodes" in g["Properties"]["GroupDescription"]]
    assert len(nodes) == 1 and tags(nodes[0])["karpenter.sh/discovery"] == "beacon-demo"
