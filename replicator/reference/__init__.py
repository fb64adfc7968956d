"""Generators of the reference documents (docs/configuration.md, docs/metrics.md) from the
code, so they cannot drift; a test fails when a committed one is stale.
"""
