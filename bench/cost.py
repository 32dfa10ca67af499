"""What a team's stacks cost idle, counted from the synthesized templates and priced from the dated
table in bench/prices.json (us-east-1 list prices; nothing here reaches a pricing API).

Idle means no training: what bills by the hour or month whether or not a job runs. Logs, S3 and EFS
data, NAT and endpoint traffic, and the nodes Karpenter launches for jobs come on top.
`make bench` rewrites the cost page's table (docs/cost.md) and the README's line from here; tests/test_cost.py
checks they agree.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aws_cdk import App

from beacon_constructs.bastion import BASTION_INSTANCE_TYPE
from beacon_ops.templates import Template, load_templates
from config.model import DEMO_TEAM, parse_team, team_file
from stacks.beacon_app import build_app

ROOT = Path(__file__).resolve().parent.parent
PRICES_PATH = Path(__file__).with_name("prices.json")
README = ROOT / "README.md"
COST_PAGE = ROOT / "docs" / "cost.md"  # the table; the README keeps the one-line summary
TABLE, SUMMARY = "idle-cost", "idle-cost-summary"  # the generated sections: the cost page's table, the README's line
# EKS managed node groups get a 20 GiB root volume unless DiskSize says otherwise.
DEFAULT_NODE_DISK_GIB = 20


@dataclass(frozen=True)
class Line:
    item: str
    quantity: float
    monthly_usd: float
    detail: str = ""  # what the quantity counts, where the profiles differ in kind

    def cell(self) -> str:
        counted = f"{self.detail} = " if self.detail else f"{self.quantity:g} = "
        return f"{counted}${self.monthly_usd:,.2f}"


def load_prices(path: Path = PRICES_PATH) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def _resources(templates: Mapping[str, Template], resource_type: str) -> list[dict[str, Any]]:
    return [r for t in templates.values() for r in t.of_type(resource_type).values()]


def idle_cost(templates: Mapping[str, Template], prices: Mapping[str, Any]) -> list[Line]:
    """One line per billed item of an idle team, monthly, from the templates' resources."""
    month = float(prices["hours_per_month"])
    hourly, monthly = prices["hourly"], prices["monthly"]
    lines: list[Line] = []

    def per_hour(item: str, quantity: float, price: float, detail: str = "") -> None:
        lines.append(Line(item, quantity, quantity * price * month, detail))

    def per_month(item: str, quantity: float, price: float) -> None:
        lines.append(Line(item, quantity, quantity * price))

    per_hour("EKS control plane", len(_resources(templates, "AWS::EKS::Cluster")), hourly["eks_cluster"])
    per_hour("NAT gateway", len(_resources(templates, "AWS::EC2::NatGateway")), hourly["nat_gateway"])
    per_hour("public IPv4 address (NAT)", len(_resources(templates, "AWS::EC2::EIP")), hourly["public_ipv4_address"])
    endpoints = [
        r
        for r in _resources(templates, "AWS::EC2::VPCEndpoint")
        if r["Properties"].get("VpcEndpointType") == "Interface"
    ]
    endpoint_azs = sum(len(r["Properties"]["SubnetIds"]) for r in endpoints)
    per_hour(
        "interface endpoints x AZs",
        endpoint_azs,
        hourly["interface_endpoint_per_az"],
        f"{len(endpoints)} x {endpoint_azs // max(len(endpoints), 1)}",
    )
    disk_gib = 0.0
    for group in _resources(templates, "AWS::EKS::Nodegroup"):
        props = group["Properties"]
        count = props["ScalingConfig"]["DesiredSize"]
        (instance_type,) = props["InstanceTypes"]
        per_hour("system nodes", count, hourly[f"ec2:{instance_type}"], f"{count} x {instance_type}")
        disk_gib += count * props.get("DiskSize", DEFAULT_NODE_DISK_GIB)
    per_month("system node disks (GiB, gp3)", disk_gib, monthly["ebs_gp3_per_gb"])
    per_month("KMS keys", len(_resources(templates, "AWS::KMS::Key")), monthly["kms_key"])
    per_month(
        "CloudWatch alarms (team)",
        len(_resources(templates, "AWS::CloudWatch::Alarm")),
        monthly["cloudwatch_standard_alarm"],
    )
    per_month(
        "CloudWatch dashboard",
        len(_resources(templates, "AWS::CloudWatch::Dashboard")),
        monthly["cloudwatch_dashboard"],
    )
    advanced = [r for r in _resources(templates, "AWS::SSM::Parameter") if r["Properties"].get("Tier") == "Advanced"]
    per_month("SSM advanced parameter", len(advanced), monthly["ssm_advanced_parameter"])
    return lines


def total(lines: list[Line]) -> float:
    return sum(line.monthly_usd for line in lines)


def readme_section(standard: list[Line], lean: list[Line], prices: Mapping[str, Any]) -> str:
    """The cost page's table: both profiles, item by item, and the totals."""
    rows = [
        "| item (per month) | standard | lean |",
        "| --- | ---: | ---: |",
    ]
    for ours, theirs in zip(standard, lean, strict=True):
        rows.append(f"| {ours.item} | {ours.cell()} | {theirs.cell()} |")
    rows.append(f"| **idle total** | **${total(standard):,.0f}** | **${total(lean):,.0f}** |")
    bastion = float(prices["hourly"][f"ec2:{BASTION_INSTANCE_TYPE}"]) * float(prices["hours_per_month"])
    note = (
        f"The optional bastion (`cluster.bastion = true`) adds one {BASTION_INSTANCE_TYPE}: ${bastion:,.2f} a month. "
        f"Computed by `make bench` (`bench/cost.py`) from the synthesized templates of the demo team in each "
        f"profile, at {prices['region']} list prices as of {prices['as_of']} (`bench/prices.json`), "
        f"{prices['hours_per_month']} hours a month."
    )
    return "\n".join([*rows, "", note])


def readme_summary(standard: list[Line], lean: list[Line], prices: Mapping[str, Any]) -> str:
    """The README's first-screen line on cost."""
    return (
        f"**Idle cost per team**: about ${total(standard):,.0f} a month (lean profile: ${total(lean):,.0f}) at "
        f"{prices['region']} list prices of {prices['as_of']}, before logs, data and training nodes; "
        "see [What it costs](docs/cost.md)."
    )


def synthesize_team(raw: dict[str, Any], outdir: Path) -> dict[str, Template]:
    """Synthesize a team in-process with cdk.json's context (cdk-nag on), and read its templates."""
    context = json.loads((ROOT / "cdk.json").read_text())["context"]
    config = parse_team(raw, team_file(str(raw["team"])))
    app = App(outdir=str(outdir), context={**context, "team": config.team})
    build_app(app, config)
    app.synth()
    return load_templates(outdir)


def demo_profiles(workdir: Path) -> tuple[dict[str, Template], dict[str, Template]]:
    """The demo team's templates in the standard and the lean profile."""
    raw = tomllib.loads(team_file(DEMO_TEAM).read_text())
    return (
        synthesize_team({**raw, "profile": "standard"}, workdir / "standard"),
        synthesize_team({**raw, "profile": "lean"}, workdir / "lean"),
    )


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:begin (make bench writes this) -->", f"<!-- {name}:end -->"


def replace_section(text: str, name: str, body: str) -> str:
    begin, end = _markers(name)
    start, stop = text.index(begin) + len(begin), text.index(end)
    return f"{text[:start]}\n{body}\n{text[stop:]}"


def section(text: str, name: str) -> str:
    begin, end = _markers(name)
    return text[text.index(begin) + len(begin) : text.index(end)].strip("\n")


def bench_idle_cost(workdir: Path, readme: Path = README, page: Path = COST_PAGE) -> dict[str, Any]:
    """Price both profiles, rewrite the cost page's table and the README's line, and return the figures."""
    prices = load_prices()
    standard_templates, lean_templates = demo_profiles(workdir)
    standard, lean = idle_cost(standard_templates, prices), idle_cost(lean_templates, prices)
    page.write_text(replace_section(page.read_text(), TABLE, readme_section(standard, lean, prices)))
    readme.write_text(replace_section(readme.read_text(), SUMMARY, readme_summary(standard, lean, prices)))
    return {
        "idle_cost_per_month_usd": round(total(standard), 2),
        "idle_cost_lean_per_month_usd": round(total(lean), 2),
        "prices_as_of": prices["as_of"],
    }
