"""The process and its world: the distributed group, the DataLoader lifeline, the liveness file, torchrun's
error file and the preflight that runs before anything else."""
