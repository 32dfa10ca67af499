"""Beacon's training runtime: the library teams import in their own training. Imports nothing of
Beacon's outside this package."""
