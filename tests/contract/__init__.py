"""Contract tests shared by several implementations of one seam (run from unit/integration)."""
