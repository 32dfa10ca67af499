"""Synthesize a team's app in-process, the way `cdk synth` would, with cdk.json's context."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from aws_cdk import App
from aws_cdk.assertions import Template

from beacon_ops.templates import Template as SynthesizedTemplate
from beacon_ops.templates import load_templates
from config import TeamConfig, names
from stacks.beacon_app import BeaconStacks, build_app

ROOT = Path(__file__).resolve().parents[2]


def cdk_json_context() -> dict[str, object]:
    return dict(json.loads((ROOT / "cdk.json").read_text())["context"])


@dataclass(frozen=True)
class Synthesized:
    config: TeamConfig
    stacks: BeaconStacks
    outdir: Path
    templates: dict[str, SynthesizedTemplate]

    def assertions(self, stack_name: str) -> Template:
        return Template.from_json(self.templates[stack_name].body)

    def template(self, component: str) -> SynthesizedTemplate:
        return self.templates[names.stack_name(self.config.team, component)]


def synthesize(config: TeamConfig, outdir: Path) -> Synthesized:
    app = App(outdir=str(outdir), context={**cdk_json_context(), "team": config.team})
    stacks = build_app(app, config)
    app.synth()  # raises ValidationFailed on any unacknowledged cdk-nag finding
    return Synthesized(config, stacks, outdir, load_templates(outdir))
