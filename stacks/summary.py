"""Print what a synth produced: each stack, its resources by type, and its outputs."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

# CDK's cross-stack plumbing: outputs no one reads by hand.
INTERNAL_OUTPUT_PREFIXES = ("ExportsOutput", "PublishOutput")


def user_facing(outputs: list[str]) -> list[str]:
    return [name for name in outputs if not name.startswith(INTERNAL_OUTPUT_PREFIXES)]


def summarize(outdir: Path) -> str:
    lines = []
    for template_path in sorted(outdir.glob("*.template.json")):
        template = json.loads(template_path.read_text())
        resources = template.get("Resources", {})
        counts = Counter(r["Type"] for r in resources.values())
        lines.append(f"{template_path.name.removesuffix('.template.json')}: {len(resources)} resources")
        lines.extend(f"    {count:3d}  {kind}" for kind, count in sorted(counts.items()))
        outputs = user_facing(sorted(template.get("Outputs", {})))
        if outputs:
            lines.append(f"    outputs: {', '.join(outputs)}")
    report = outdir / "validation-report.json"
    if report.exists():
        plugin = json.loads(report.read_text())["pluginReports"][0]
        lines.append(
            f"cdk-nag {plugin['pluginName']}: {plugin['conclusion']}, "
            f"{len(plugin['violations'])} findings, {len(plugin.get('suppressedViolations', []))} acknowledged"
        )
    lines.append(f"templates in {outdir}/")
    return "\n".join(lines)


if __name__ == "__main__":
    print(summarize(Path(sys.argv[1] if len(sys.argv) > 1 else "cdk.out")))
