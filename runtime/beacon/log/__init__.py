"""The one log on the spool volume: the journal (every step, kill-safe on return from `run.log`), the spool's
chunks and their state, its one owner, and recovery against what S3 holds. Imports the contract and the ground
floor's foundations alone."""
