"""The doctor's cost of a hung, silent or slow run (issue 30): its instances placed as far as the evidence reaches,
priced by the contract's cost function (`beacon_ops.doctor.run_cost`)."""

from __future__ import annotations

from dataclasses import replace

from beacon.contract.goodput import PRICES_AS_OF
from beacon.contract.rank_evidence import RankProgress

from beacon_ops.doctor.orchestrator import NodeView
from beacon_ops.doctor.run_cost import cost_verdict, placement
from beacon_ops.doctor.verdict import Verdict

DOCUMENT = RankProgress(0, 0, 4, 900, "training", 0.5, 1.0, 0.5, 1, "train-0", "node-0", "g6.12xlarge", 0)
LISTED = f"(list prices of {PRICES_AS_OF})"


def test_the_run_is_placed_from_its_nodes_then_sagemakers_resources_then_the_ranks_documents() -> None:
    nodes = {name: NodeView(name, exists=True, capacity_type=capacity, instance_type="p5.48xlarge")
             for name, capacity in (("a", "on-demand"), ("b", "on-demand"), ("c", "spot"))}  # fmt: skip
    assert placement(nodes, [], None) == [("p5.48xlarge", "on-demand", 2), ("p5.48xlarge", "spot", 1)]
    job = {"ResourceConfig": {"InstanceType": "ml.g5.xlarge", "InstanceCount": 2}, "EnableManagedSpotTraining": True}
    assert placement({}, [], job) == [("ml.g5.xlarge", "spot", 2)]
    documents = [replace(DOCUMENT, rank=r, node=f"node-{r // 2}") for r in range(4)]
    assert placement({}, documents, None) == [("g6.12xlarge", "", 2)], "each node once, capacity not recorded"
    assert placement({}, [replace(DOCUMENT, node="")], None) == []


def costed(
    cause: str,
    where: list[tuple[str, str, int]],
    *,
    progress_age: float = 14 * 60.0,
    heartbeat_age: float = 10.0,
    slow_share: float | None = None,
    slowed_ratio: float | None = None,
    prices: dict[str, dict[str, float]] | None = None,
) -> Verdict | None:
    return cost_verdict(cause, where, progress_age=progress_age, heartbeat_age=heartbeat_age, slow_share=slow_share,
                        slowed_ratio=slowed_ratio, prices=prices)  # fmt: skip


def test_a_hang_says_what_it_cost_so_far_and_a_slow_rank_what_each_hour_of_it_wastes() -> None:
    where = [("p5.48xlarge", "on-demand", 8)]
    hung = costed("rank-hung", where)
    assert hung is not None and (hung.check, hung.status, hung.verdict) == ("cost", "info", "so far")
    assert hung.evidence == (
        f"hung for 14 min on 8 instances of p5.48xlarge: 1.87 instance-hours, $103 at on-demand {LISTED}"
    )
    silent = costed("silent", where, heartbeat_age=300.0)
    assert silent is not None and silent.evidence.startswith("silent for 5 min on 8 instances")
    slow = costed("rank-slow", [("g6.12xlarge", "", 2)], slow_share=0.33)
    assert (
        slow is not None
        and slow.verdict == "each hour"
        and slow.evidence
        == (
            "the other ranks wait for it: 33% of every instance-hour; each hour it stays so wastes, on 2 instances of "
            f"g6.12xlarge: 0.66 instance-hours, $3.04 at on-demand (capacity type not recorded) {LISTED}"
        )
    )
    slowed = costed("run-slowed", where, slowed_ratio=2.0)
    assert slowed is not None and "its steps take 2.00x its baseline: 50% of every instance-hour" in slowed.evidence
    assert costed("healthy", where) is None and costed("rank-hung", []) is None


def test_the_teams_own_prices_win_over_the_list_and_price_its_spot_instances() -> None:
    where = [("p5.48xlarge", "on-demand", 8), ("p5.48xlarge", "spot", 2)]
    own = {"on-demand": {"p5.48xlarge": 40.0}, "spot": {"p5.48xlarge": 20.0}}
    hung = costed("stalled", where, progress_age=3600.0, prices=own)
    assert hung is not None and hung.evidence == (
        "stalled for 60 min on 8 instances of p5.48xlarge: 8.00 instance-hours, $320 at on-demand (the team's "
        "prices); on 2 instances of p5.48xlarge: 2.00 instance-hours, $40.00 at spot (the team's prices)"
    )
    listed = costed("stalled", where, progress_age=3600.0)
    assert listed is not None and "2.00 instance-hours (no spot price for p5.48xlarge" in listed.evidence


def test_the_alarms_function_reads_the_team_files_prices_from_its_environment_or_falls_back_to_the_list() -> None:
    from beacon_ops.doctor.notify import prices_of

    assert prices_of('{"on-demand": {"p5.48xlarge": 40}, "spot": {}}') == {"on-demand": {"p5.48xlarge": 40.0},
                                                                          "spot": {}}  # fmt: skip
    assert prices_of("") == {} and prices_of("not json") == {} and prices_of('["a"]') == {}


def test_an_ended_run_or_released_job_is_not_priced_as_idle_and_only_the_nodes_its_pods_hold_are() -> None:
    """The doctor's cost stops growing where the run no longer holds its instances (review of issue 30)."""
    from datetime import UTC, datetime

    from beacon_ops.doctor import diagnosis
    from beacon_ops.doctor.orchestrator import JobState, OrchestratorState, PodState
    from beacon_ops.doctor.sagemaker_state import TrainingJobReading
    from beacon_ops.evidence.reading import RunEvidence

    now = datetime.now(UTC)

    def inputs(*pods: PodState, training_job: TrainingJobReading | None = None) -> diagnosis.DoctorInputs:
        job = JobState("training", "r", now, (), 1, 0, 0, pods=pods) if pods else None
        state = OrchestratorState("eks", "c", "training", "r", now, job=job) if job else None
        return diagnosis.DoctorInputs("demo", "e", "r", "b", "us-east-1", None, None, orchestrator=state,
                                      training_job=training_job)  # fmt: skip

    running, done = PodState("r-0", "Running", "node-b", now), PodState("r-0-old", "Failed", "node-a", now)
    assert diagnosis._released(inputs(), RunEvidence("e", "r", final={"state": "failed"})), "its final state"
    assert diagnosis._released(inputs(done), RunEvidence("e", "r")), "its pods are done: nothing held"
    assert not diagnosis._released(inputs(done, running), RunEvidence("e", "r"))
    ended = TrainingJobReading("j", {"TrainingJobStatus": "Stopped"}, Verdict("orchestrator", "ok", "", ""))
    assert diagnosis._released(inputs(training_job=ended), RunEvidence("e", "r"))
    nodes = {n: NodeView(n, exists=True, instance_type="p5.48xlarge") for n in ("node-a", "node-b")}
    assert list(diagnosis._held(inputs(done, running), nodes)) == ["node-b"], "an earlier attempt's node is not held"
