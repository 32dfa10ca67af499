"""Beacon's reusable CDK constructs, one module per logical unit.

Not named `constructs`: that would shadow the library aws-cdk-lib itself imports.
"""
