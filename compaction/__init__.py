"""Compaction: merges level-N segments of a region into level N+1 (docs/architecture.md,
"The pipeline"; the README's "Compaction").
"""
