"""Egress controller (see SPEC and issue)."""
