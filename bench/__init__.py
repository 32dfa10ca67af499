"""`make bench`: the figures Beacon is judged by. Ratios of interleaved runs, medians."""
