"""Operator tools behind the ``replicator`` command: bucket sync, segment reports, verify."""
