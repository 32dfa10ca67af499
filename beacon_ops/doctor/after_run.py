"""A run's verdict once its job ended: read from S3 once, verified against what the job should have left, and
diagnosed from that same reading. `beacon smoke`, `beacon run` and `beacon local` take their verdict here, so a
record on its way back from S3 passes the evidence room (read, verified) and the doctor once each, then goes up to
the command that shows it; the diagnosis is made whether or not the command shows it (a passing run's costs a few
metric questions `MetricsReadOnce` mostly answered already).
"""

from __future__ import annotations

from dataclasses import dataclass

from botocore.exceptions import BotoCoreError, ClientError

from beacon_ops.doctor.diagnosis import Diagnosis, DoctorInputs, diagnose
from beacon_ops.evidence.alarms import AlarmSet
from beacon_ops.evidence.reading import RunEvidence
from beacon_ops.evidence.verify import Expected, Verification, read_and_verify


@dataclass(frozen=True)
class RunVerdict:
    evidence: RunEvidence | None
    verification: Verification | None
    diagnosis: Diagnosis | None  # None only when the doctor could not read the run either
    unreadable: str = ""  # why verification could not read the run (then the doctor's checks say more)


def verify_and_diagnose(inputs: DoctorInputs, *, expected: Expected, alarms: AlarmSet) -> RunVerdict:
    """`inputs.s3` and `inputs.cloudwatch` read as the reader (pass a `MetricsReadOnce`: verification and the
    doctor then share each metric answer)."""
    try:
        evidence, verification = read_and_verify(
            s3=inputs.s3,
            cloudwatch=inputs.cloudwatch,
            bucket=inputs.bucket,
            team=inputs.team,
            experiment=inputs.experiment,
            run=inputs.run,
            expected=expected,
            alarms=alarms,
        )
    except (ClientError, BotoCoreError) as error:
        unreadable = f"verification could not read the run as the reader role: {error}"
        try:  # the doctor reads on its own terms: its checks say why (no bucket, a refused read)
            return RunVerdict(None, None, diagnose(inputs), unreadable)
        except (ClientError, BotoCoreError):
            return RunVerdict(None, None, None, unreadable)
    return RunVerdict(evidence, verification, diagnose(inputs, evidence=evidence))
