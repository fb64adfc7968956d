"""The embedded stack for the demo, the tests and trying things out: local brokers and a
moto server (processes), their buckets and queue, and the demo. Production never imports
this package.
"""
