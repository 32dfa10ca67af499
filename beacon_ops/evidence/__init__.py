"""A run's evidence: read once (chunks, final state, preflights, metrics, alarms), verified, and the
alarm evaluator. Imports nothing of the operator above it (smoke, doctor, local, cli)."""
