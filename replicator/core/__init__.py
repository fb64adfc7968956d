"""The core every service builds on: settings, errors, keys, storage, Kafka, metrics.

Nothing here imports ``egress``, ``ingress`` or ``compaction``.
"""
