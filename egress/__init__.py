"""Egress: source topics into level-0 segments on S3 (SPEC 1-3, issue 3).

Modules:

* ``controller``: ``Egress`` (the consumer, the poll loop, assignment, metrics server).
* ``partition_writer``: one writer per assigned partition and its durability method
  (``PartitionWriter.make_durable``: finish → copy to the final key → delete temp →
  commit ``end + 1``).
* ``columns``: consumed messages into ``SEGMENT_SCHEMA`` batches (the hot path).
* ``rotation``: pure decisions (close reasons, memory victims, segment starts).
* ``topic_meta``: the ``_topic.json`` body. ``metrics``: the egress metrics.

Decisions worth knowing:

* Segment names are positions: a segment starts where the previous one ended + 1, or at
  the committed offset the partition resumed from, so segments touch across transaction
  markers, aborted and compacted records. When the source deleted records before egress
  read them (retention), the range is logged at ERROR with its bounds and counted in
  ``replicator_egress_source_lost_messages_total``, and the next segment *still* starts at
  the committed position: ingress then sees touching segments and does not wait for, and
  report a second time, a gap that egress has already reported exactly.
* Offsets are committed only by step 4 of the durability method. The worker hands the
  synchronous commit to the poll thread (librdkafka serves a commit issued from another
  thread only on the poll thread's next ``consume`` anyway) and waits for its result.
* A segment that cannot be made durable is aborted (nothing visible, nothing committed);
  its partition is paused, later segments of it are aborted too, and after a backoff the
  consumer is rewound to the failed segment's start. Other partitions keep flowing.
* Memory: ``egress.max_buffered_bytes`` covers every open and closing segment (column
  lists, batches waiting for a worker, the format's row-group buffer, the upload's part
  buffer). Above it the largest open segments close early (reason ``memory``); while the
  closes are in flight consumption pauses.
"""
