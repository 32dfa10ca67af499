"""`make destroy`: every stack but the retained state, in dependency order, then what remains.

The stateful stack is termination-protected so that no one deletes it by accident; its data
(bucket, file system, image repository, keys) has DeletionPolicy Retain, so deleting the stack never
deletes the data.
`make destroy` records what will remain, lifts the protection, stops what runs on the cluster, destroys the
stacks one by one in reverse dependency order (read from the synthesized cloud assembly), and prints how to
remove the rest.

A GPU job stops the destroy unless it is stopped first: its pods carry do-not-disrupt, the GPU pool's nodes
wait up to its terminationGracePeriod (24 h) for them, and deleting the EC2NodeClass waits on its finalizer
longer than the kubectl handler's 15 minutes. So `beacon_ops.jobs.drain`, before anything else, deletes the
team's Jobs (their pods drain on SIGTERM) and waits a bounded time for the training namespace to be empty, else
says in one line what still runs and how to end it; the stacks' deletion then removes the NodePools from empty
nodes.

    python -m beacon_ops.teardown order CDK_OUT            stack names, the order to destroy them
    python -m beacon_ops.teardown prepare --team T CDK_OUT record retained resources, lift protection
    python -m beacon_ops.jobs.drain --team T              stop the team's Jobs, wait for their pods (jobs' room)
    python -m beacon_ops.teardown remains --team T         what is left and how to remove it
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from beacon_ops.aws_access import AccessError, describe_aws_error, open_session
from beacon_ops.templates import load_templates
from config import ConfigError, load_team, names

RECORD_DIR = Path(".beacon/destroy")
RETAINED_POLICIES = ("Retain", "RetainExceptOnCreate")

# How to remove what CloudFormation leaves behind, by resource type ({id}: the physical id).
REMOVAL = {
    "AWS::S3::Bucket": "empty it with every version (S3 console: Empty), then `aws s3api delete-bucket --bucket {id}`",
    "AWS::EFS::FileSystem": "`aws efs delete-file-system --file-system-id {id}` (deletes the training volume's data)",
    "AWS::KMS::Key": "`aws kms schedule-key-deletion --key-id {id} --pending-window-in-days 7` (once nothing "
    "encrypted with it is kept)",
    "AWS::Logs::LogGroup": "`aws logs delete-log-group --log-group-name {id}`",
    "AWS::ECR::Repository": "`aws ecr delete-repository --repository-name {id} --force` (deletes its images)",
}


@dataclass(frozen=True)
class Retained:
    stack: str
    logical_id: str
    resource_type: str
    physical_id: str = ""

    def removal(self) -> str:
        how = REMOVAL.get(self.resource_type, "remove it in the console")
        return how.format(id=self.physical_id or f"<{self.logical_id}>")


def destroy_order(cdk_out: Path) -> list[str]:
    """The app's stacks, each after every stack that depends on it (reverse dependency order)."""
    artifacts = json.loads((cdk_out / "manifest.json").read_text())["artifacts"]
    stacks = {name: a for name, a in artifacts.items() if a["type"] == "aws:cloudformation:stack"}
    depends = {name: [d for d in a.get("dependencies", []) if d in stacks] for name, a in stacks.items()}
    ordered: list[str] = []
    while len(ordered) < len(stacks):
        # A stack may go once no remaining stack depends on it.
        ready = sorted(
            name
            for name in stacks
            if name not in ordered and not any(name in depends[o] for o in stacks if o not in ordered and o != name)
        )
        if not ready:
            raise ValueError(f"dependency cycle among {sorted(set(stacks) - set(ordered))}")
        ordered.append(ready[0])
    return ordered


def retained_resources(cdk_out: Path) -> list[Retained]:
    return [
        Retained(stack=name, logical_id=logical_id, resource_type=resource["Type"])
        for name, template in load_templates(cdk_out).items()
        for logical_id, resource in template.resources.items()
        if resource.get("DeletionPolicy") in RETAINED_POLICIES
    ]


def record_path(team: str) -> Path:
    return RECORD_DIR / f"{team}-retained.json"


def prepare(cloudformation: Any, team: str, cdk_out: Path) -> list[Retained]:
    """Name every retained resource (physical ids from CloudFormation) and lift the stateful stack's protection."""
    found: list[Retained] = []
    for item in retained_resources(cdk_out):
        try:
            answer = cloudformation.describe_stack_resource(StackName=item.stack, LogicalResourceId=item.logical_id)
            physical = answer["StackResourceDetail"].get("PhysicalResourceId", "")
        except ClientError:
            continue  # the stack or resource was never deployed: nothing of it remains
        found.append(Retained(item.stack, item.logical_id, item.resource_type, physical))
    stateful = names.stack_name(team, "artifacts")
    try:
        cloudformation.update_termination_protection(EnableTerminationProtection=False, StackName=stateful)
    except ClientError as error:
        if "does not exist" not in str(error):
            raise
    return found


def remains_text(team: str, retained: list[Retained]) -> str:
    outside = [
        f"  {group}: `aws logs delete-log-group --log-group-name {group}`"
        for group in names.container_insights_log_groups(names.cluster_name(team))
    ]
    kept = [
        "Outside the stacks (Container Insights' log groups, which the observability add-on created and the stack "
        "held to your retention; they keep your training output until it expires), if they exist:",
        *outside,
    ]
    if not retained:
        return "\n".join([f"beacon: every stack of {team} is gone, and nothing was retained.", *kept])
    lines = [
        f"beacon: the stacks of {team} are gone. Retained on purpose (your training history and its keys), "
        "still billed until you remove them:"
    ]
    lines += [f"  {r.resource_type} {r.physical_id or r.logical_id} (from {r.stack}): {r.removal()}" for r in retained]
    lines += kept
    lines.append("A later `make deploy` creates new ones; it adopts the log groups, not the retained resources.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m beacon_ops.teardown", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    order = sub.add_parser("order")
    order.add_argument("cdk_out", type=Path)
    prep = sub.add_parser("prepare")
    prep.add_argument("--team", required=True)
    prep.add_argument("cdk_out", type=Path)
    remains = sub.add_parser("remains")
    remains.add_argument("--team", required=True)
    args = parser.parse_args(argv)
    if args.step == "order":
        print(" ".join(destroy_order(args.cdk_out)))
        return 0
    if args.step == "remains":
        path = record_path(args.team)
        retained = [Retained(**r) for r in json.loads(path.read_text())] if path.is_file() else []
        print(remains_text(args.team, retained))
        return 0
    try:
        config = load_team(args.team)
        session = open_session(region_flag=None, team_region=config.region)
        retained = prepare(session.client("cloudformation"), args.team, args.cdk_out)
    except ConfigError as error:
        for line in error.lines:
            print(f"beacon destroy: {line}", file=sys.stderr)
        return 2
    except AccessError as error:
        print(f"beacon destroy: {error}", file=sys.stderr)
        return 2
    except (ClientError, BotoCoreError) as error:
        print(f"beacon destroy: {describe_aws_error(error)}", file=sys.stderr)
        return 2
    record_path(args.team).parent.mkdir(parents=True, exist_ok=True)
    record_path(args.team).write_text(json.dumps([asdict(r) for r in retained], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
