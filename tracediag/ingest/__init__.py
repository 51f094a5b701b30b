"""Readers: one trace file to a `trace.FileTrace` (events in the event-table schema, and the file's
metadata); `read.py` finds the format from the content and calls the reader (docs/formats/)."""
