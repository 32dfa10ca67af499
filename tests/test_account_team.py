"""A real team's first synth: an account and a region, offline, cdk-nag enforced, alarms that notify
someone, and the lean profile's opt-outs (issue 12, items 1, 2 and 6)."""

from __future__ import annotations

import json
from typing import Any

from beacon_constructs.network import INTERFACE_ENDPOINTS
from tests.conftest import ACCOUNT_TEAM
from tests.support.synth import ROOT, Synthesized


def test_synth_with_an_account_passes_cdk_nag_and_needs_no_lookup(account_team: Synthesized) -> None:
    report = json.loads((account_team.outdir / "validation-report.json").read_text())
    plugins = {plugin["pluginName"]: plugin for plugin in report["pluginReports"]}
    assert "AwsSolutions" in plugins
    for plugin in plugins.values():
        assert plugin["conclusion"] == "success", plugin["pluginName"]
        assert plugin["violations"] == []
    manifest = json.loads((account_team.outdir / "manifest.json").read_text())
    assert "missing" not in manifest, manifest.get("missing")  # a lookup would need credentials
    for name in account_team.templates:
        artifact = manifest["artifacts"][name]
        assert artifact["environment"] == "aws://123456789012/eu-west-1"


def test_the_vpc_uses_named_azs_of_the_team_region(account_team: Synthesized) -> None:
    zones = {
        s["Properties"]["AvailabilityZone"]
        for s in account_team.template("network").of_type("AWS::EC2::Subnet").values()
    }
    assert zones == {"eu-west-1a", "eu-west-1b"}


def test_the_alarm_topic_mails_every_address(account_team: Synthesized) -> None:
    subscriptions = account_team.template("monitoring").of_type("AWS::SNS::Subscription").values()
    assert sorted((s["Properties"]["Protocol"], s["Properties"]["Endpoint"]) for s in subscriptions) == [
        ("email", "ml-lead@example.com"),
        ("email", "ml-oncall@example.com"),
    ]


def test_the_existing_topic_receives_every_notifying_alarm(account_team: Synthesized) -> None:
    (chat,) = ACCOUNT_TEAM["monitoring"]["alarm_topic_arns"]  # type: ignore[index]
    monitoring = account_team.template("monitoring")
    (restarts,) = [
        a for a in monitoring.of_type("AWS::CloudWatch::Alarm").values() if a["Properties"].get("AlarmActions")
    ]
    assert chat in restarts["Properties"]["AlarmActions"]
    assert chat in restarts["Properties"]["OKActions"]
    _, parameter = monitoring.one_of_type("AWS::SSM::Parameter")
    assert chat in json.dumps(parameter["Properties"]["Value"])  # the per-run composite's actions


def karpenter_values(cluster: Any) -> str:
    """The chart's values as synthesized (a JSON string joined with the queue's name)."""
    (chart,) = [
        r
        for r in cluster.of_type("Custom::AWSCDK-EKS-HelmChart").values()
        if r["Properties"].get("Release") == "karpenter"
    ]
    return json.dumps(chart["Properties"]["Values"])


def test_lean_profile_drops_the_extra_endpoints_and_runs_one_small_system_node(account_team: Synthesized) -> None:
    endpoints = account_team.template("network").of_type("AWS::EC2::VPCEndpoint").values()
    interface = [e for e in endpoints if e["Properties"].get("VpcEndpointType") == "Interface"]
    assert len(interface) == len(INTERFACE_ENDPOINTS)
    cluster = account_team.template("cluster")
    (nodegroup,) = cluster.of_type("AWS::EKS::Nodegroup").values()
    assert nodegroup["Properties"]["ScalingConfig"]["DesiredSize"] == 1
    assert nodegroup["Properties"]["InstanceTypes"] == ["t3.medium"]
    assert '\\"replicas\\":1,' in karpenter_values(cluster)


def test_the_bastion_is_ssm_only_private_and_may_reach_the_api_on_443(account_team: Synthesized) -> None:
    cluster = account_team.template("cluster")
    (instance_id, instance) = cluster.one_of_type("AWS::EC2::Instance")
    props = instance["Properties"]
    assert "KeyName" not in props  # no SSH key: Session Manager only
    assert "SubnetId" in props and "NetworkInterfaces" not in props  # a node subnet, no public address
    (bastion_group,) = [g for g in props["SecurityGroupIds"] if "Bastion" in json.dumps(g)]
    ingress = [
        r["Properties"]
        for r in cluster.of_type("AWS::EC2::SecurityGroupIngress").values()
        if r["Properties"].get("SourceSecurityGroupId") == bastion_group
    ]
    assert ingress and {(r["FromPort"], r["ToPort"], r["IpProtocol"]) for r in ingress} == {(443, 443, "tcp")}
    outputs = cluster.body["Outputs"]
    assert outputs["BastionInstanceId"]["Value"] == {"Ref": instance_id}
    assert "ClusterEndpoint" in outputs


def test_no_bastion_unless_the_team_file_asks(demo: Synthesized) -> None:
    assert demo.template("cluster").of_type("AWS::EC2::Instance") == {}


def test_the_docs_walk_through_the_bastion_with_the_real_output_names(account_team: Synthesized) -> None:
    steps = (ROOT / "docs" / "private-cluster.md").read_text()
    for output in ("BastionInstanceId", "ClusterEndpoint"):
        assert output in account_team.template("cluster").body["Outputs"]
        assert f"OutputKey=='{output}'" in steps
    assert "AWS-StartPortForwardingSessionToRemoteHost" in steps and "--kubernetes-url https://127.0.0.1:8443" in steps
