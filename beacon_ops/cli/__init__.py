"""The `beacon` command: one module per command, and main (signals, exit codes, one way to fail)."""
