"""What a hung, silent or slow run has cost so far (issue 30): its instances, as far as the evidence places them,
priced by the goodput ledger's cost function (`beacon.contract.goodput.cost_of`). The doctor calls it once the
cause is known; the alarm's notification carries the doctor's verdicts, this one among them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from beacon.contract.goodput import cost_of
from beacon.contract.rank_evidence import RankProgress

from beacon_ops.doctor.orchestrator import NodeView
from beacon_ops.doctor.verdict import INFO, Verdict

# The causes whose instances sit idle, and which age says since when (the last step, or the last heartbeat).
IDLE_SINCE_PROGRESS = {"rank-hung": "hung", "rank-silent": "idle", "rank-died": "idle", "stalled": "stalled"}
IDLE_SINCE_HEARTBEAT = {"silent": "silent"}


def placement(
    nodes: Mapping[str, NodeView], documents: Sequence[RankProgress], training_job: Mapping[str, Any] | None
) -> list[tuple[str, str, int]]:
    """(instance type, capacity type, instances) of the run, as far as the evidence reaches: the nodes its
    orchestrator shows (EKS: each node's labels), SageMaker's ResourceConfig, else the ranks' documents (each node
    once, with the instance type it recorded; capacity not recorded)."""
    if nodes:
        return [(kind, capacity, n) for (kind, capacity), n in
                sorted(Counter((v.instance_type, v.capacity_type) for v in nodes.values()).items())]  # fmt: skip
    resources = (training_job or {}).get("ResourceConfig") or {}
    if isinstance(resources.get("InstanceCount"), int) and resources.get("InstanceType"):
        spot = (training_job or {}).get("EnableManagedSpotTraining") is True
        return [(str(resources["InstanceType"]), "spot" if spot else "on-demand", resources["InstanceCount"])]
    placed = {d.node: d.instance for d in documents if d.node}
    return [(kind, "", n) for kind, n in sorted(Counter(placed.values()).items())]


def cost_verdict(
    cause: str,
    where: list[tuple[str, str, int]],
    *,
    progress_age: float | None,
    heartbeat_age: float | None,
    slow_share: float | None,
    slowed_ratio: float | None,
    prices: dict[str, dict[str, float]] | None = None,
) -> Verdict | None:
    """The cost check of a run whose instances sit idle (hung, stalled, silent: so far) or wait (a slow rank, the
    run slowed: each hour it stays so); None for any other cause, or where nothing places the run."""
    if not where:
        return None
    if cause in IDLE_SINCE_PROGRESS and progress_age is not None:
        how, seconds = IDLE_SINCE_PROGRESS[cause], progress_age
    elif cause in IDLE_SINCE_HEARTBEAT and heartbeat_age is not None:
        how, seconds = IDLE_SINCE_HEARTBEAT[cause], heartbeat_age
    elif cause == "rank-slow" and slow_share is not None:
        return _waiting("the other ranks wait for it", slow_share, where, prices)
    elif cause == "run-slowed" and slowed_ratio is not None:
        return _waiting(f"its steps take {slowed_ratio:.2f}x its baseline", 1 - 1 / slowed_ratio, where, prices)
    else:
        return None
    return Verdict("cost", INFO, "so far", f"{how} for {_minutes(seconds)} on {_each(seconds, where, prices)}")


def _waiting(
    what: str, share: float, where: list[tuple[str, str, int]], prices: dict[str, dict[str, float]] | None
) -> Verdict:
    """Each hour of waiting: `share` of every instance's hour."""
    return Verdict("cost", INFO, "each hour", f"{what}: {share:.0%} of every instance-hour; each hour it stays so "
                   f"wastes, on {_each(3600 * share, where, prices)}")  # fmt: skip


def _each(seconds: float, where: list[tuple[str, str, int]], prices: dict[str, dict[str, float]] | None) -> str:
    """`seconds` of every placed instance, priced: one part per instance type and capacity."""
    costs = [cost_of(seconds, instances=n, instance_type=kind, capacity=capacity, prices=prices)
             for kind, capacity, n in where]  # fmt: skip
    return "; on ".join(f"{cost.on()}: {cost.priced()}" for cost in costs)


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"
