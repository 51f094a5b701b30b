"""Renderers: an analysis, a comparison, a check, a prediction or plan, a hang report and the watch
metrics, as text, HTML and figures (nothing here computes a result)."""
