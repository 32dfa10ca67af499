"""What a rank leaves for the doctor: its progress clock, its rank document and stack dumps, the flight recorder,
the one stall rule, the live-evidence uploader (rank 0 or a node leader) and the rank board."""
