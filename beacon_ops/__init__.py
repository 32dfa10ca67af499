"""The operator side of Beacon: reads synthesized templates and the shared contract."""
