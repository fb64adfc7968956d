# Everyday tasks. Tools come from the virtual environment in .venv (override: make VENV=...):
#   python3 -m venv .venv && .venv/bin/pip install -e '.[dev,local,compaction]'
# `bash .ci/run` is the CI: a fresh environment, lint, typecheck, every test.

VENV ?= .venv
PY := $(VENV)/bin/python
# The tests never ask the cloud's metadata service, and Spark stays on loopback.
export AWS_EC2_METADATA_DISABLED := true
export SPARK_LOCAL_IP := 127.0.0.1

.PHONY: help lint typecheck spell check test-fast test-integration test-chaos test \
        bench-quick docs docs-check tag constraints base-image-digest

help:  ## this list
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-17s %s\n", $$1, $$2}'

lint:  ## ruff (style, imports, SDK seams, docstrings, complexity)
	$(PY) -m ruff check .

typecheck:  ## mypy, strict, on the packages, the tests and the benchmarks
	$(PY) -m mypy

spell:  ## codespell
	$(VENV)/bin/codespell

check: lint typecheck spell  ## lint + typecheck + spell

test-fast:  ## the unit tier (about 30 s)
	$(PY) -m pytest -q -m "not integration and not chaos"

test-integration:  ## real brokers (Apache Kafka with KAFKA_HOME, else Tansu), moto, Spark
	$(PY) -m pytest -q -m "integration and not chaos"

test-chaos:  ## the fault-injection rounds
	$(PY) -m pytest -q -m chaos

test:  ## every test (what .ci/run runs)
	$(PY) -m pytest -q

bench-quick:  ## the benchmarks, short version (about 4 minutes; see bench/README.md)
	$(PY) bench/run_all.py --quick

docs:  ## regenerate docs/configuration.md and docs/metrics.md from the code
	$(PY) -m replicator.reference.configuration > docs/configuration.md
	$(PY) -m replicator.reference.metrics > docs/metrics.md

docs-check:  ## fail if the generated docs are stale
	$(PY) -m pytest -q tests/unit/test_settings_reference.py tests/unit/test_metrics_reference.py

tag:  ## tag the version in pyproject.toml (after its CHANGELOG.md entry is written)
	@v=$$($(PY) -c "import tomllib; print(tomllib.load(open('pyproject.toml','rb'))['project']['version'])"); \
	grep -q "^## \[$$v\]" CHANGELOG.md || { echo "CHANGELOG.md has no entry for $$v"; exit 1; }; \
	git tag -a "v$$v" -m "kafka-s3-replicator $$v" && echo "tagged v$$v"

constraints:  ## pin deploy/constraints.txt to the versions installed in the venv (what the tests ran with)
	@{ sed -n '1,3p' deploy/constraints.txt; $(PY) -m pip freeze --all --exclude-editable \
	  | grep -v -e '^kafka-s3-replicator' -e '^setuptools==' -e '^wheel=='; } > deploy/constraints.txt.new \
	  && mv deploy/constraints.txt.new deploy/constraints.txt && echo "deploy/constraints.txt updated"

base-image-digest:  ## print the digest of the Dockerfile's base image tag (needs registry access)
	docker buildx imagetools inspect python:3.11-slim-bookworm --format '{{json .Manifest.Digest}}'
