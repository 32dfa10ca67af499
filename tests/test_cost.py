"""The README's idle cost is what bench/cost.py computes from the current templates (issue 12, item 6)."""

from __future__ import annotations

import json
from datetime import date

from beacon_constructs.network import EXTRA_INTERFACE_ENDPOINTS, INTERFACE_ENDPOINTS
from bench.cost import (
    COST_PAGE,
    PRICES_PATH,
    SUMMARY,
    TABLE,
    idle_cost,
    load_prices,
    readme_section,
    readme_summary,
    section,
)
from tests.support.synth import ROOT, Synthesized


def test_the_price_table_is_dated_and_for_one_region() -> None:
    prices = json.loads(PRICES_PATH.read_text())
    assert date.fromisoformat(prices["as_of"]) and prices["region"] == "us-east-1"


def test_readme_cost_table_and_first_screen_match_the_templates(demo: Synthesized, account_team: Synthesized) -> None:
    """demo is the standard profile; account_team is lean (its region and account change no count)."""
    assert demo.config.profile == "standard" and account_team.config.profile == "lean"
    prices = load_prices()
    standard, lean = idle_cost(demo.templates, prices), idle_cost(account_team.templates, prices)
    readme = (ROOT / "README.md").read_text()
    hint = "the stacks changed: run `make bench` (or bench.cost.bench_idle_cost) to rewrite the cost page and line"
    assert section(COST_PAGE.read_text(), TABLE) == readme_section(standard, lean, prices), hint
    assert section(readme, SUMMARY) == readme_summary(standard, lean, prices), hint


def test_idle_cost_counts_what_the_issue_lists(demo: Synthesized) -> None:
    lines = {line.item: line for line in idle_cost(demo.templates, load_prices())}
    assert lines["EKS control plane"].monthly_usd == 73.0
    assert lines["NAT gateway"].quantity == 1
    endpoints = len(INTERFACE_ENDPOINTS) + len(EXTRA_INTERFACE_ENDPOINTS)
    assert lines["interface endpoints x AZs"].quantity == endpoints * demo.config.network.az_count
    assert lines["system nodes"].detail == "2 x m7i.large"
    assert lines["KMS keys"].quantity == 4


def test_lean_drops_exactly_the_extra_endpoints(demo: Synthesized, account_team: Synthesized) -> None:
    def interface_endpoints(synthesized: Synthesized) -> int:
        found = synthesized.template("network").of_type("AWS::EC2::VPCEndpoint").values()
        return sum(e["Properties"].get("VpcEndpointType") == "Interface" for e in found)

    assert interface_endpoints(demo) - interface_endpoints(account_team) == len(EXTRA_INTERFACE_ENDPOINTS)
