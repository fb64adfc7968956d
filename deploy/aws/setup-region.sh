#!/usr/bin/env bash
# Render deploy/aws/ templates for one region and (optionally) apply them with the AWS CLI.
#
#   deploy/aws/setup-region.sh render       # write rendered JSON to $OUT (default: ./rendered/$REGION)
#   deploy/aws/setup-region.sh bucket       # bucket (versioned, encrypted, TLS-only, lifecycle) + SQS queue + notification
#   deploy/aws/setup-region.sh iam          # IRSA roles for egress/ingress/compaction (+ its Spark driver) + the S3 replication role
#                                           # (+ with ARCHIVE=true: the archive committer's role and compaction's table swap)
#                                           # (+ with MIRROR=true: egress's grant to copy its segments into the peer bucket)
#   deploy/aws/setup-region.sh replication  # S3 replication to the peer bucket (run after both regions' `bucket`)
#
# Settings (environment):
#   REGION            this region, e.g. us-east-1                                  (required)
#   PEER_REGION       the other region; also the ingress source region             (required)
#   ACCOUNT_ID        AWS account id                                               (required)
#   KMS_KEY_ARN       this region's KMS key ARN (SSE-KMS)                          (required)
#   PEER_KMS_KEY_ARN  the peer region's KMS key ARN (replicas are encrypted with it) (required)
#   OIDC_PROVIDER     the EKS cluster's OIDC issuer without https:// (for `iam`)
#   BUCKET            default replicator-$REGION        PEER_BUCKET  default replicator-$PEER_REGION
#   QUEUE_NAME        default replicator-$REGION-events NAMESPACE    default replicator
#   PREFIX / TEMP_PREFIX  default data / temp (must match [s3] prefix / temp_prefix)
#   ARCHIVE           true: the archive tables ([catalog] with AWS Glue, deploy/k8s/components/archive):
#                     `iam` creates the role of the archive committer and adds iam/archive-compaction.json
#                     to compaction's roles; false (default): neither (and that policy is removed again)
#   MIRROR            true: egress runs with [egress.mirror] (the low-RPO mode, docs/sizing.md):
#                     `iam` adds iam/egress-mirror.json to egress's role (PutObject on the peer
#                     bucket's data/$REGION/, the peer key through S3); false (default): that
#                     policy is removed again
#   WAREHOUSE_PREFIX  default iceberg: the Iceberg warehouse in $BUCKET ([catalog] warehouse =
#                     "s3://$BUCKET/$WAREHOUSE_PREFIX"); never under PREFIX or TEMP_PREFIX
#   GLUE_DATABASE     default replicator: the Glue database ([catalog] namespace, one level)
#   GLUE_ACCOUNT_ID / GLUE_REGION  the Glue Data Catalog's (default ACCOUNT_ID / REGION;
#                     [catalog] properties glue.id / glue.region)
#   ENDPOINT_URL      optional: passed as --endpoint-url to every call (S3-compatible or local
#                     endpoints; e.g. the embedded stack's moto server)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${REGION:?set REGION}" "${PEER_REGION:?set PEER_REGION}" "${ACCOUNT_ID:?set ACCOUNT_ID}"
: "${KMS_KEY_ARN:?set KMS_KEY_ARN}" "${PEER_KMS_KEY_ARN:?set PEER_KMS_KEY_ARN}"
export REGION PEER_REGION ACCOUNT_ID KMS_KEY_ARN PEER_KMS_KEY_ARN
export BUCKET="${BUCKET:-replicator-$REGION}"
export PEER_BUCKET="${PEER_BUCKET:-replicator-$PEER_REGION}"
export QUEUE_NAME="${QUEUE_NAME:-replicator-$REGION-events}"
export NAMESPACE="${NAMESPACE:-replicator}"
export PREFIX="${PREFIX:-data}" TEMP_PREFIX="${TEMP_PREFIX:-temp}"
export SOURCE_REGION="${SOURCE_REGION:-$PEER_REGION}"
export OIDC_PROVIDER="${OIDC_PROVIDER:-}"
export ARCHIVE="${ARCHIVE:-false}" WAREHOUSE_PREFIX="${WAREHOUSE_PREFIX:-iceberg}"
export GLUE_DATABASE="${GLUE_DATABASE:-replicator}"
export GLUE_ACCOUNT_ID="${GLUE_ACCOUNT_ID:-$ACCOUNT_ID}" GLUE_REGION="${GLUE_REGION:-$REGION}"
case "$ARCHIVE" in true|false) ;; *) echo "ARCHIVE must be true or false" >&2; exit 2 ;; esac
export MIRROR="${MIRROR:-false}"
case "$MIRROR" in true|false) ;; *) echo "MIRROR must be true or false" >&2; exit 2 ;; esac
# The lifecycle expires temp/ after a day, and segments are only what is under PREFIX.
case "$WAREHOUSE_PREFIX/" in
  "$PREFIX/"*|"$TEMP_PREFIX/"*)
    echo "WAREHOUSE_PREFIX must not be under PREFIX or TEMP_PREFIX" >&2; exit 2 ;;
esac
OUT="${OUT:-$PWD/rendered/$REGION}"
# One IRSA role replicator-$REGION-<name> per ServiceAccount replicator-<name>.
# The archive committer's (archive) is created only with ARCHIVE=true.
IRSA_ACCOUNTS="egress ingress compaction compaction-driver archive"

# Only these variables are substituted; any other `$` in a template stays as it is.
VARS='${REGION} ${PEER_REGION} ${ACCOUNT_ID} ${KMS_KEY_ARN} ${PEER_KMS_KEY_ARN} ${BUCKET}
${PEER_BUCKET} ${QUEUE_NAME} ${NAMESPACE} ${PREFIX} ${TEMP_PREFIX} ${SOURCE_REGION}
${OIDC_PROVIDER} ${CONTROLLER} ${WAREHOUSE_PREFIX} ${GLUE_DATABASE} ${GLUE_ACCOUNT_ID}
${GLUE_REGION}'

aws() { command aws ${ENDPOINT_URL:+--endpoint-url "$ENDPOINT_URL"} "$@"; }

render() {
  mkdir -p "$OUT/s3" "$OUT/sqs" "$OUT/iam"
  OUT="$(cd "$OUT" && pwd)"
  (
    cd "$HERE"
    for f in s3/*.json sqs/*.json iam/egress.json iam/ingress.json iam/compaction.json \
             iam/archive.json iam/archive-compaction.json iam/egress-mirror.json \
             iam/s3-replication.json iam/s3-replication-trust.json; do
      CONTROLLER="" envsubst "$VARS" < "$f" > "$OUT/$f"
    done
    for c in $IRSA_ACCOUNTS; do
      CONTROLLER="$c" envsubst "$VARS" < iam/irsa-trust.json > "$OUT/iam/irsa-trust-$c.json"
    done
  )
  echo "rendered to $OUT" >&2
}

bucket() {
  render
  # Every step below may be repeated: existing resources are updated, not recreated.
  if aws s3api head-bucket --region "$REGION" --bucket "$BUCKET" >/dev/null 2>&1; then
    echo "bucket $BUCKET exists" >&2
  elif [ "$REGION" = us-east-1 ]; then
    aws s3api create-bucket --region "$REGION" --bucket "$BUCKET"
  else
    aws s3api create-bucket --region "$REGION" --bucket "$BUCKET" \
      --create-bucket-configuration "LocationConstraint=$REGION"
  fi
  # Versioning is required by S3 replication (and keeps deleted segments for a week, see
  # the lifecycle rule expire-replaced-segment-versions).
  aws s3api put-bucket-versioning --region "$REGION" --bucket "$BUCKET" \
    --versioning-configuration Status=Enabled
  aws s3api put-public-access-block --region "$REGION" --bucket "$BUCKET" \
    --public-access-block-configuration \
    BlockPublicAcls=true,IgnorePublicAcls=true,BlockPublicPolicy=true,RestrictPublicBuckets=true
  aws s3api put-bucket-encryption --region "$REGION" --bucket "$BUCKET" \
    --server-side-encryption-configuration "file://$OUT/s3/encryption.json"
  # TLS only. Skipped for a plain-http endpoint (a local test server), which it would lock out.
  case "${ENDPOINT_URL:-https://}" in
    http://*) echo "skipping the TLS-only bucket policy for $ENDPOINT_URL" >&2 ;;
    *) aws s3api put-bucket-policy --region "$REGION" --bucket "$BUCKET" \
         --policy "file://$OUT/s3/bucket-policy.json" ;;
  esac
  aws s3api put-bucket-lifecycle-configuration --region "$REGION" --bucket "$BUCKET" \
    --lifecycle-configuration "file://$OUT/s3/lifecycle.json"
  # SSE-SQS (SQS-managed keys): S3 can send to it without a KMS key policy.
  aws sqs create-queue --region "$REGION" --queue-name "$QUEUE_NAME" \
    --attributes SqsManagedSseEnabled=true,MessageRetentionPeriod=1209600,VisibilityTimeout=60
  local url
  url="$(aws sqs get-queue-url --region "$REGION" --queue-name "$QUEUE_NAME" \
         --query QueueUrl --output text)"
  # set-queue-attributes wants the policy as a JSON string inside a JSON object.
  printf '{"Policy": "%s"}' "$(sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' "$OUT/sqs/queue-policy.json" | tr -d '\n')" \
    > "$OUT/sqs/queue-attributes.json"
  aws sqs set-queue-attributes --region "$REGION" --queue-url "$url" \
    --attributes "file://$OUT/sqs/queue-attributes.json"
  aws s3api put-bucket-notification-configuration --region "$REGION" --bucket "$BUCKET" \
    --notification-configuration "file://$OUT/s3/notification.json"
}

ensure_role() {  # name trust-policy-file
  if aws iam get-role --region "$REGION" --role-name "$1" >/dev/null 2>&1; then
    aws iam update-assume-role-policy --region "$REGION" --role-name "$1" \
      --policy-document "file://$2"
  else
    aws iam create-role --region "$REGION" --role-name "$1" \
      --assume-role-policy-document "file://$2"
  fi
}

iam() {
  : "${OIDC_PROVIDER:?set OIDC_PROVIDER (aws eks describe-cluster --query cluster.identity.oidc.issuer)}"
  render
  for c in $IRSA_ACCOUNTS; do
    if [ "$c" = archive ] && [ "$ARCHIVE" != true ]; then
      echo "no role for the archive committer (ARCHIVE=true creates it)" >&2
      continue
    fi
    # The Spark driver (deploy/compaction/) has its own ServiceAccount, so its own role (a
    # trust names exactly one ServiceAccount), with the compaction policy.
    policy="${c%-driver}"
    ensure_role "replicator-$REGION-$c" "$OUT/iam/irsa-trust-$c.json"
    aws iam put-role-policy --region "$REGION" --role-name "replicator-$REGION-$c" \
      --policy-name "replicator-$policy" --policy-document "file://$OUT/iam/$policy.json"
    # Egress with [egress.mirror] copies each segment into the peer bucket: a second
    # policy of its role, only while the mirror is on.
    if [ "$c" = egress ]; then
      if [ "$MIRROR" = true ]; then
        aws iam put-role-policy --region "$REGION" --role-name "replicator-$REGION-egress" \
          --policy-name replicator-egress-mirror \
          --policy-document "file://$OUT/iam/egress-mirror.json"
      elif aws iam get-role-policy --region "$REGION" --role-name "replicator-$REGION-egress" \
             --policy-name replicator-egress-mirror >/dev/null 2>&1; then
        aws iam delete-role-policy --region "$REGION" --role-name "replicator-$REGION-egress" \
          --policy-name replicator-egress-mirror
      fi
    fi
    # Compaction swaps its inputs for its output in the archive tables before it deletes
    # them ([catalog] enabled): a second policy of its roles, only while the archive is on.
    if [ "$policy" = compaction ]; then
      if [ "$ARCHIVE" = true ]; then
        aws iam put-role-policy --region "$REGION" --role-name "replicator-$REGION-$c" \
          --policy-name replicator-archive-compaction \
          --policy-document "file://$OUT/iam/archive-compaction.json"
      elif aws iam get-role-policy --region "$REGION" --role-name "replicator-$REGION-$c" \
             --policy-name replicator-archive-compaction >/dev/null 2>&1; then
        aws iam delete-role-policy --region "$REGION" --role-name "replicator-$REGION-$c" \
          --policy-name replicator-archive-compaction
      fi
    fi
  done
  ensure_role "replicator-$REGION-s3-replication" "$OUT/iam/s3-replication-trust.json"
  aws iam put-role-policy --region "$REGION" --role-name "replicator-$REGION-s3-replication" \
    --policy-name replicator-s3-replication --policy-document "file://$OUT/iam/s3-replication.json"
}

replication() {
  render
  aws s3api put-bucket-replication --region "$REGION" --bucket "$BUCKET" \
    --replication-configuration "file://$OUT/s3/replication.json"
}

case "${1:-}" in
  render|bucket|iam|replication) "$1" ;;
  *) sed -n '2,29p' "$0" >&2; exit 2 ;;
esac
