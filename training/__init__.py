"""What runs in the training image. Imports nothing of Beacon's outside this package."""
