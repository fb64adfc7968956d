#!/usr/bin/env bash
# Compaction through spark-submit in cluster mode: Spark starts the driver as a pod too.
# The driver runs compaction/__main__.py (the replicator-compaction CLI); the config sets
# spark_master = "" so the master comes from --master here. The executor image (with the
# package installed, Dockerfile.executor) serves both the driver and the executors, and
# the config file must be inside it or mounted into the driver pod (pod template).
#
#   deploy/compaction/spark-submit.sh us-east-1 /etc/replicator/config.toml
#
# For scheduled runs prefer the CronJob in spark-on-k8s.yaml (client mode): it needs no
# spark-submit binary, keeps one driver per region, and its exit code reaches Kubernetes.
set -euo pipefail

REGION=${1:?region}
CONFIG=${2:?config path inside the driver pod}
NAMESPACE=${NAMESPACE:-replicator}
IMAGE=${IMAGE:-REGISTRY/kafka-s3-replicator-spark-executor:TAG}
API_SERVER=${API_SERVER:-https://kubernetes.default.svc:443}

exec spark-submit \
  --master "k8s://${API_SERVER}" \
  --deploy-mode cluster \
  --name "replicator-compaction-${REGION}" \
  --conf spark.kubernetes.namespace="${NAMESPACE}" \
  --conf spark.kubernetes.container.image="${IMAGE}" \
  --conf spark.kubernetes.authenticate.driver.serviceAccountName=replicator-compaction-driver \
  --conf spark.kubernetes.authenticate.executor.serviceAccountName=replicator-compaction \
  --conf spark.kubernetes.executor.podTemplateFile=deploy/compaction/executor-pod-template.yaml \
  --conf spark.executor.instances=4 \
  --conf spark.executor.cores=2 \
  --conf spark.executor.memory=1g \
  --conf spark.executor.memoryOverhead=1g \
  --conf spark.task.maxFailures=1 \
  --conf spark.pyspark.python=/usr/bin/python3 \
  local:///opt/replicator/compaction_main.py \
  --config "${CONFIG}" --once \
  "${@:3}"
