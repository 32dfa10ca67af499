"""The one final-state rule (`beacon.contract.final_state_superseded`), which `beacon.sync` and every reader use:
a final state is an earlier attempt's once a later attempt started."""

from __future__ import annotations

import pytest
from beacon import contract

FINAL = {"state": "finished", "attempt": 1, "ended_at": 1000.0}


@pytest.mark.parametrize(
    ("attempts", "started_at", "superseded"),
    [
        ((), (), False),  # nothing else: the final state stands
        ((0, 1), (), False),  # records of its own attempt and earlier ones
        ((0, 1, 2), (), True),  # a later attempt's records
        ((), (900.0,), False),  # an attempt that started before it ended: its own
        ((), (1000.5,), True),  # one that started after it ended: a later attempt, before any record
        ((1,), (900.0, 1200.0), True),  # either sign is enough
    ],
)
def test_a_final_state_is_an_earlier_attempts_once_a_later_one_started(
    attempts: tuple[int, ...], started_at: tuple[float, ...], superseded: bool
) -> None:
    assert contract.final_state_superseded(FINAL, attempts=attempts, attempts_started_at=started_at) is superseded


def test_a_final_state_without_an_attempt_is_judged_by_its_time_alone() -> None:
    """Releases before final states named their attempt wrote attempt N's without a number: a later record says
    nothing of it; a preflight after its end does."""
    older = {"state": "finished", "ended_at": 1000.0}
    assert contract.final_state_superseded(older, attempts=(0, 1, 2)) is False
    assert contract.final_state_superseded(older, attempts=(1,), attempts_started_at=(1200.0,)) is True


@pytest.mark.parametrize("forged", [{"attempt": True}, {"attempt": "3"}, {"ended_at": True}, {"ended_at": "later"}])
def test_a_field_of_another_type_is_no_sign_of_a_later_attempt(forged: dict[str, object]) -> None:
    final = {**FINAL, **forged}
    assert contract.final_state_superseded(final, attempts=(0,), attempts_started_at=(10.0,)) is (
        "ended_at" not in forged and False
    )
