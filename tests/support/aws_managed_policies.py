"""The AWS managed policies Beacon's roles carry, as far as the policy evaluator may rely on them.

A vendored text (tests/reference/aws-managed-policies/) is evaluated like any identity policy. For a
policy that is not vendored, only the services its actions belong to are recorded, from AWS's
managed-policy reference: a request for another service cannot depend on it, and a request for one of
its services raises rather than guess.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

TEXTS_DIR = Path(__file__).resolve().parent.parent / "reference" / "aws-managed-policies"

# Not vendored: the services their statements name, and nothing else is known of them.
SERVICES: dict[str, frozenset[str]] = {
    "AmazonEKS_CNI_Policy": frozenset({"ec2"}),
    "AmazonEKSWorkerNodePolicy": frozenset({"ec2", "eks", "eks-auth"}),
    "AmazonSSMManagedInstanceCore": frozenset({"ssm", "ssmmessages", "ec2messages"}),
}


def policy_name(arn: str) -> str:
    """``arn:aws:iam::aws:policy/service-role/X`` -> ``X``."""
    if ":iam::aws:policy/" not in arn:
        raise ValueError(f"not an AWS managed policy ARN: {arn}")
    return arn.rsplit("/", 1)[-1]


@cache
def text(name: str) -> dict[str, Any] | None:
    path = TEXTS_DIR / f"{name}.json"
    return dict(json.loads(path.read_text())) if path.exists() else None


def irrelevant(name: str, action: str) -> bool:
    """True when the policy's text is not here but it grants nothing of the action's service."""
    services = SERVICES.get(name)
    return services is not None and action.split(":", 1)[0].lower() not in services
