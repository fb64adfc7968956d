"""Ingress controller (see SPEC and issue)."""
