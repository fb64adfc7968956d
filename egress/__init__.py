"""Egress: source topics into level-0 segments on S3 (docs/architecture.md, "The pipeline"
and "Durability").

Modules:

* ``controller``: ``Egress``: wiring, lifecycle, assignment (rebalance callbacks).
* ``poll_loop``: the poll thread's turn: fetch, dispatch, ticks (age, flow, rewinds).
* ``partition_writer``: one writer per assigned partition and its durability method
  (``PartitionWriter.make_durable``: finish → copy to the final key → delete temp →
  commit ``end + 1``); ``segment``: one segment's state and outcome.
* ``commits``: step 4, offset commits served on the poll thread.
* ``columns``: consumed messages into ``SEGMENT_SCHEMA`` batches (the hot path).
* ``rotation``: pure decisions (close reasons, segment starts); ``flow``: pure flow
  control (memory budget, victims, pauses).
* ``topic_meta``: writes ``_topic.json``. ``metrics``: the egress metrics.

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
  buffer, the encoders' working memory). Above it the largest open segments close early
  (reason ``memory``); while the closes are in flight consumption pauses. Encodes are
  admitted within the same budget (``encode_gate``): one reserves its working memory before
  it runs, and one larger than the budget runs alone. ``allocators``:
  the Parquet encoders' Arrow pool and glibc's thresholds, so RSS follows what is held.
"""
