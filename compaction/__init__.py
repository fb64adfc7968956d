"""Compaction: merges level-N segments of a region into level N+1 (docs/architecture.md,
"The pipeline"; docs/services.md, "Compaction").
"""
