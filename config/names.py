"""The names a team's deployment derives from its team name: its stacks, its cluster and the Karpenter
node role. The stacks create them; the operator finds them by them."""

from __future__ import annotations

STACK_COMPONENTS = ("network", "artifacts", "cluster", "monitoring")


def stack_name(team: str, component: str) -> str:
    return f"beacon-{team}-{component}"


def cluster_name(team: str) -> str:
    return f"beacon-{team}"


def karpenter_node_role_name(team: str) -> str:
    """The Karpenter node role, named as upstream's template names it. A fixed name lets the artifacts
    stack (deployed first) name the role in its image repository's policy without a reference."""
    return f"KarpenterNodeRole-{cluster_name(team)}"
