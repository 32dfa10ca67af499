"""Plain-data builders for any training job's Kubernetes objects. Used by the stacks and the operator."""
