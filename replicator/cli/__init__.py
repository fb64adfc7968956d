"""Command-line entry points (the only place that configures logging and reads argv)."""
