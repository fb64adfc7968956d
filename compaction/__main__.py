"""``python -m compaction`` / ``spark-submit .../compaction/__main__.py``: the compaction CLI."""

from replicator.cli.compaction import main

if __name__ == "__main__":
    main()
