"""A job on a team's deployed stack: one flow (flow.run_job) and its targets (eks, sagemaker); the smoke
job is flow.run_smoke, a team's own job team.py."""
