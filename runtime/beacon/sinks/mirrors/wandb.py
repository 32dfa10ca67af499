"""The W&B mirror: `run.log` with each record's own step and wall time, into a run whose id is Beacon's.

`wandb.init(id=..., resume="allow")` makes every start of a Beacon run feed one W&B run. Online,
a resumed run tells where it is: the last sequence number in its summary, and the last (attempt, step) it
holds, so nothing shows twice. Offline (`wandb_mode="offline"`) there is no server to ask, and the cursor
alone decides; the run's files stay on the spool's volume for `wandb sync`.

Across restarts: W&B's own step only grows (its rewind is a preview), so every row also carries
`beacon_step` and `beacon_attempt`. A restart's pass over steps an earlier attempt logged goes on at W&B's
next step with its own `beacon_step`: plotted against `beacon_step`, both attempts show, and the summary's
`beacon_superseded` names the earlier attempt's superseded range (`{"attempt-00000": "10-14"}`).
A send returns once wandb's own process has the points (its local log); wandb uploads them itself.
`wandb` is imported only here, when the mirror opens.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from beacon.contract import FinalState, Record
from beacon.sinks.mirrors import History, RunInfo

if TYPE_CHECKING:
    from wandb.sdk.wandb_run import Run as WandbRun

log = logging.getLogger("beacon.mirrors.wandb")

SEQ_KEY = "beacon_mirrored_seq"  # in the run's summary: the last sequence number W&B holds
STATE_KEY = "beacon_final_state"  # in the summary too: finished, failed or preempted, as Beacon says
LAST_KEY = "beacon_last"  # in the summary: [attempt, step] of the last record W&B holds
SUPERSEDED_KEY = "beacon_superseded"  # in the summary: {"attempt-<k>": "<first>-<last>"}
STEP_KEY, ATTEMPT_KEY = "beacon_step", "beacon_attempt"  # in every row
EXIT_CODE = {FinalState.FINISHED: 0, FinalState.FAILED: 1, FinalState.PREEMPTED: 143}  # 143: SIGTERM


def wandb_run_id(experiment: str, run: str) -> str:
    """One W&B run per Beacon run, even in a project several experiments share ('.' is in neither id)."""
    return f"{experiment}.{run}"


class WandbMirror:
    name = "wandb"

    def __init__(self, project: str, mode: str, *, finish_timeout: float) -> None:
        self.project = project
        self.mode = mode
        self.finish_timeout = finish_timeout
        self._run: WandbRun | None = None
        self._next_step = 0  # W&B drops a step below its current one
        self._history = History()

    def open(self, run: RunInfo) -> int | None:
        import wandb

        directory = os.environ.get("WANDB_DIR") or str(run.directory)
        os.makedirs(directory, exist_ok=True)
        opened = wandb.init(
            project=self.project,
            id=wandb_run_id(run.experiment, run.run),
            name=run.run,
            group=run.experiment,
            config={"beacon": {"team": run.team, "experiment": run.experiment, "run": run.run}},
            resume="allow",
            mode="offline" if self.mode == "offline" else "online",
            dir=directory,
            reinit="create_new",
            settings=wandb.Settings(
                console="off",  # the team's stdout stays theirs
                silent=True,
                x_disable_stats=True,
                x_disable_machine_info=True,
                save_code=False,
                disable_git=True,
                finish_timeout=self.finish_timeout,  # what W&B has not uploaded by then, `wandb sync` can
            ),
        )
        self._run = opened
        if not opened.resumed:
            return None if self.mode == "offline" else -1
        self._next_step = opened.step
        # Its last row's own keys (a summary keeps each key's last value, row by row), else the last batch's mark.
        attempt: Any = opened.summary.get(ATTEMPT_KEY)  # type: ignore[no-untyped-call]
        step: Any = opened.summary.get(STEP_KEY)  # type: ignore[no-untyped-call]
        last: Any = [attempt, step] if attempt is not None and step is not None else opened.summary.get(LAST_KEY)  # type: ignore[no-untyped-call]
        superseded: Any = opened.summary.get(SUPERSEDED_KEY)  # type: ignore[no-untyped-call]
        self._history = History(
            (int(last[0]), int(last[1])) if last else None, dict(superseded) if superseded else None
        )
        held: Any = opened.summary.get(SEQ_KEY)  # type: ignore[no-untyped-call]
        log.info("mirroring to W&B run %s (resumed at step %d)", opened.id, self._next_step)
        return int(held) if held is not None else None

    def send(self, records: Sequence[Record]) -> None:
        run = self._opened()
        rewound = False
        for record in records:
            if self._history.held(record):
                continue  # a resumed run already holds this record
            after = History(self._history.last, self._history.superseded)
            rewound |= after.take(record)
            step = max(record.step, self._next_step)  # a restart's pass goes on at W&B's next step
            row = {**record.metrics, STEP_KEY: record.step, ATTEMPT_KEY: record.attempt, "_timestamp": record.wall_time}
            run.log(row, step=step, commit=True)
            self._history, self._next_step = after, step + 1  # W&B has the row: it is held now
        if records:
            run.summary[SEQ_KEY] = records[-1].seq
            if self._history.last is not None:
                run.summary[LAST_KEY] = list(self._history.last)
            if rewound:
                run.summary[SUPERSEDED_KEY] = dict(self._history.superseded)

    def held_through(self, record: Record) -> None:
        self._history.held_through(record)

    def close(self, state: FinalState) -> None:
        run = self._opened()
        run.summary[STATE_KEY] = state.value
        if state is FinalState.PREEMPTED:
            run.mark_preempting()
        run.finish(exit_code=EXIT_CODE[state])

    def _opened(self) -> WandbRun:
        if self._run is None:
            raise RuntimeError("the W&B mirror is not open")
        return self._run
