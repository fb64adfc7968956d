#!/usr/bin/env bash
# Create the topics ingress uses in a destination region's Kafka cluster (docs/architecture.md,
# "Checkpoints" and "Segment events"; docs/failover.md, "The offset map").
# Ingress creates them itself when its principal may (CreateTopics); run this where topic
# creation is reserved to operators, before the first ingress start.
#
#   BOOTSTRAP=b-1.kafka.us-east-1.example.internal:9096 \
#   COMMAND_CONFIG=client.properties \
#   deploy/kafka/create-topics.sh
#
# Settings (environment):
#   BOOTSTRAP             bootstrap servers of this region's cluster                   (required)
#   COMMAND_CONFIG        kafka-topics.sh --command-config file (TLS/SASL); optional
#   KAFKA_TOPICS          kafka-topics.sh to run (default: kafka-topics.sh on PATH)
#   REPLICATION_FACTOR    default 3
#   MIN_INSYNC_REPLICAS   default 2 (with acks=all: a write survives one broker loss)
#   SEGMENT_EVENTS_TOPIC  default replicator.segmentevents  (= ingress.segment_events_topic)
#   SEGMENT_EVENTS_RETENTION_MS  default 3600000 (1h)      (= ingress.segment_events_retention)
#   CHECKPOINT_TOPIC      default replicator.checkpoint     (= ingress.checkpoint_topic)
#   OFFSET_MAP_TOPIC      default replicator.offsetmap      (= ingress.offset_map_topic;
#                         set it to "" where ingress.offset_map = false)
#   SEGMENT_EVENTS_PARTITIONS / CHECKPOINT_PARTITIONS  default 1 / 1 (see below)
set -euo pipefail

: "${BOOTSTRAP:?set BOOTSTRAP (host:port list of this region)}"
KAFKA_TOPICS="${KAFKA_TOPICS:-kafka-topics.sh}"
REPLICATION_FACTOR="${REPLICATION_FACTOR:-3}"
MIN_INSYNC_REPLICAS="${MIN_INSYNC_REPLICAS:-2}"
SEGMENT_EVENTS_TOPIC="${SEGMENT_EVENTS_TOPIC:-replicator.segmentevents}"
SEGMENT_EVENTS_RETENTION_MS="${SEGMENT_EVENTS_RETENTION_MS:-3600000}"
CHECKPOINT_TOPIC="${CHECKPOINT_TOPIC:-replicator.checkpoint}"
OFFSET_MAP_TOPIC="${OFFSET_MAP_TOPIC-replicator.offsetmap}"
# Every ingress instance reads the whole segment-events topic and the whole checkpoint
# topic (no shared consumer group), so more partitions buy no parallelism; one keeps the
# events in arrival order.
SEGMENT_EVENTS_PARTITIONS="${SEGMENT_EVENTS_PARTITIONS:-1}"
CHECKPOINT_PARTITIONS="${CHECKPOINT_PARTITIONS:-1}"

common=(--bootstrap-server "$BOOTSTRAP")
if [ -n "${COMMAND_CONFIG:-}" ]; then
  common+=(--command-config "$COMMAND_CONFIG")
fi

# Segment events: S3 object events fanned out to every ingress instance. Events are only
# needed until ingress has replayed or listed the segments, so an hour of retention is
# plenty; older events are found again by listing the bucket.
"$KAFKA_TOPICS" "${common[@]}" --create --if-not-exists \
  --topic "$SEGMENT_EVENTS_TOPIC" \
  --partitions "$SEGMENT_EVENTS_PARTITIONS" \
  --replication-factor "$REPLICATION_FACTOR" \
  --config cleanup.policy=delete \
  --config retention.ms="$SEGMENT_EVENTS_RETENTION_MS" \
  --config min.insync.replicas="$MIN_INSYNC_REPLICAS"

# A compacted topic of ingress (TOPIC PARTITIONS): the settings ingress creates them with
# (ingress/README.md, "Checkpoint topic"). Writes are transactional with the replayed
# records (exactly-once), hence acks=all and min.insync.replicas for durability; compacted
# soon after a write so start-up reads stay short and pruned keys go within the hour.
create_compacted() {
  "$KAFKA_TOPICS" "${common[@]}" --create --if-not-exists \
    --topic "$1" \
    --partitions "$2" \
    --replication-factor "$REPLICATION_FACTOR" \
    --config cleanup.policy=compact \
    --config min.insync.replicas="$MIN_INSYNC_REPLICAS" \
    --config min.compaction.lag.ms=0 \
    --config segment.ms=3600000 \
    --config min.cleanable.dirty.ratio=0.1
}

# Checkpoints: one record per source partition (key region:topic:partition), only the
# latest matters.
create_compacted "$CHECKPOINT_TOPIC" "$CHECKPOINT_PARTITIONS"

# Offset map: where each replayed batch landed in this cluster, for consumer-group
# failover (`replicator groups`). One key per batch entry, superseded entries pruned by
# tombstones.
if [ -n "$OFFSET_MAP_TOPIC" ]; then
  create_compacted "$OFFSET_MAP_TOPIC" 1
fi

"$KAFKA_TOPICS" "${common[@]}" --describe --topic "$SEGMENT_EVENTS_TOPIC"
"$KAFKA_TOPICS" "${common[@]}" --describe --topic "$CHECKPOINT_TOPIC"
if [ -n "$OFFSET_MAP_TOPIC" ]; then
  "$KAFKA_TOPICS" "${common[@]}" --describe --topic "$OFFSET_MAP_TOPIC"
fi
