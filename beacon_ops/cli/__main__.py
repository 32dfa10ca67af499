"""`python -m beacon_ops.cli`: what the tests and the Makefile run, the same as the `beacon` script."""

from beacon_ops.cli.main import main

main()
