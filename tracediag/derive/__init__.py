"""Tables from events, per rank: `per_rank.rank_tables` turns a rank's events into its `summary.RankSummary`
(steps, breakdown, collective instances, point-to-point, host feed, kernels, lateness windows, the replay's
per-rank half), the map half of the per-rank -> reduce seam (docs/architecture.md)."""
