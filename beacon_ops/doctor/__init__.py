"""`beacon doctor`'s diagnosis: verdicts from a run's evidence, its metrics and its alarms."""
