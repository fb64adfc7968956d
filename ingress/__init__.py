"""Ingress: replays the segments of other regions into this region's Kafka cluster
(docs/architecture.md, "The pipeline"; ingress/README.md has the modules and decisions).
"""
