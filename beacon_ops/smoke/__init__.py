"""`beacon smoke`: one flow (flow.run_smoke) and its targets (eks, sagemaker)."""
