"""What-if: replay each step from the trace with a cause's durations edited, to price each cause.

`graph.build` turns the derived tables into per-rank local segments and cross-rank sync operations,
`replay.replay` computes step times from (edited) durations, `causes` holds one edit per cause.
"""
