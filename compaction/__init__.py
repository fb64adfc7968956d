"""Compaction controller (see SPEC and issue)."""
