"""The timeline's pure parts: SageMaker's own history and a log line's moment, placed from the gap."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from beacon_ops.doctor.timeline import Moment, timeline, training_job_moments, verdict_moments
from beacon_ops.doctor.verdict import FAIL, OK, Verdict

GAP = datetime(2026, 12, 1, 10, 4, 10, tzinfo=UTC)


def test_sagemakers_transitions_a_log_line_and_the_gap_come_out_in_time_order_placed_from_the_gap() -> None:
    described = {
        "TrainingJobStatus": "Failed",
        "FailureReason": "AlgorithmError: exit code 1",
        "SecondaryStatusTransitions": [
            {"Status": "Starting", "StartTime": GAP - timedelta(minutes=5)},
            {"Status": "Training", "StartTime": GAP - timedelta(minutes=3), "StatusMessage": "Training in progress"},
        ],
        "TrainingEndTime": GAP + timedelta(seconds=4),
    }
    refused = Verdict("logs", FAIL, "connection-refused-at-start", "algo-1: refused", at=GAP - timedelta(seconds=170))
    quiet = Verdict("logs", OK, "nothing known", "no line")  # no moment: it says when nothing happened
    lines = [
        m.line()
        for m in timeline(
            [
                *training_job_moments(described),
                *verdict_moments([refused, quiet]),
                Moment(GAP, "metrics", "last heartbeat"),
            ],
            gap=GAP,
        )
    ]
    assert lines == [
        "09:59:10   t-300 s  sagemaker: Starting",
        "10:01:10   t-180 s  sagemaker: Training: Training in progress",
        "10:01:20   t-170 s  logs: connection-refused-at-start: algo-1: refused",
        "10:04:10         t  metrics: last heartbeat",
        "10:04:14     t+4 s  sagemaker: training job Failed: AlgorithmError: exit code 1",
    ]


def test_without_a_gap_the_moments_have_no_offsets() -> None:
    (moment,) = timeline([Moment(GAP, "orchestrator", "Job created")], gap=None)
    assert moment.from_gap_s is None and moment.line() == "10:04:10            orchestrator: Job created"
