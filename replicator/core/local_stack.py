"""The embedded stack: two Kafka-compatible brokers and one S3+SQS endpoint on loopback.

``LocalStack.start(dir)`` starts a Kafka broker for the source region (``us-east-1``), one
for the destination region (``us-west-1``) and a moto server (S3 and SQS for both regions),
then prepares everything the three controllers expect to exist. The brokers are Tansu (the
pip-installable default, memory storage) or, with ``kafka="apache"``, Apache Kafka from
``$KAFKA_HOME`` (KRaft, data in a temporary directory removed when the stack stops, topic
auto-creation off as in production clusters):

1. the source bucket in ``us-east-1`` and the destination bucket in ``us-west-1``, both with
   a lifecycle rule that expires ``temp/`` objects and incomplete multipart uploads;
2. the SQS queue in ``us-west-1`` and the destination bucket's ``s3:ObjectCreated:*`` /
   ``s3:ObjectRemoved:*`` notifications of the data prefix to it;
3. the source topic (every topic the pipeline needs is created explicitly: Apache Kafka
   here creates none by accident, and ingress creates its own);
4. ``egress.toml``, ``ingress.toml`` and ``compaction.toml`` in ``dir``, ready to use;
5. ``state.json`` in ``dir``: PIDs, ports and command lines of the servers.

Servers run in their own sessions, so they outlive the ``replicator local up`` process.
``LocalStack.load(dir)`` reads the state back; ``stop()`` signals only PIDs whose command
line still matches the one recorded at start, so a reused PID is never killed.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from replicator.core import s3, sqs
from replicator.core.errors import FatalError, ReplicatorError
from replicator.core.kafka import Admin
from replicator.core.processes import (
    DEFAULT_BROKER,
    LOOPBACK,
    BrokerKind,
    ServerProcess,
    check_broker_kind,
    free_port,
    process_cmdline,
    start_broker,
    start_moto,
    stop_seconds,
)
from replicator.core.settings import KafkaSettings, Settings, load_settings
from replicator.devstack import aws

log = logging.getLogger(__name__)

Role = Literal["egress", "ingress", "compaction"]
ROLES: tuple[Role, ...] = ("egress", "ingress", "compaction")

STATE_FILE = "state.json"
STATE_VERSION = 1
DEFAULT_DIR = Path(".local-stack")

SOURCE_REGION = "us-east-1"
DEST_REGION = "us-west-1"
SOURCE_BUCKET = "source-bucket"
DEST_BUCKET = "destination-bucket"
QUEUE = "destination-bucket-events-queue"
TOPIC = "sensor.events"
PARTITIONS = 4
ACCESS_KEY = "test"  # moto accepts any static credentials
SECRET_KEY = "test"  # moto placeholder, not a secret
DATA_PREFIX = "data"
TEMP_PREFIX = "temp"


def broker_names(kind: BrokerKind) -> tuple[str, str]:
    """Server names of the (source, destination) brokers of a stack of ``kind``."""
    return ("tansu-source", "tansu-destination") if kind == "tansu" else \
        ("kafka-source", "kafka-destination")


# Short group timeouts: a consumer's first assignment waits about session.timeout.ms / 2 on
# Tansu, so the librdkafka default of 45 s would make every start wait 23 s (TEST-INFRA.md);
# on Apache Kafka a killed member holds its partitions for session.timeout.ms.
FAST_GROUP_CONFIG: dict[str, int] = {
    "session.timeout.ms": 6000,
    "heartbeat.interval.ms": 500,
    "topic.metadata.refresh.interval.ms": 1000,
}

# SIGTERM first, SIGKILL after the server's own grace (``ServerRecord.grace``: Tansu and
# moto 6 s, Apache Kafka 20 s, it flushes its logs), then wait this long for the exit.
STOP_GRACE_SECONDS = 6.0
KILL_WAIT_SECONDS = 5.0


class StackError(FatalError):
    """The embedded stack cannot start, or its state file is unusable."""


@dataclass
class ServerRecord:
    """One server process of the stack, as recorded in the state file."""

    name: str
    pid: int
    port: int
    cmdline: str
    log_path: Path
    process: ServerProcess | None = None  # set when this process started it (can reap it)
    grace: float = STOP_GRACE_SECONDS
    """Seconds between SIGTERM and SIGKILL."""
    data_dir: Path | None = None
    """A broker's data directory, removed once the server is stopped (Apache Kafka)."""

    @classmethod
    def of(cls, proc: ServerProcess, grace: float = STOP_GRACE_SECONDS) -> ServerRecord:
        """Record a server we just started (its command line as the kernel reports it)."""
        return cls(proc.name, proc.pid, proc.port, process_cmdline(proc.pid), proc.log_path,
                   proc, grace, proc.data_dir)

    @property
    def address(self) -> str:
        """``127.0.0.1:port``."""
        return f"{LOOPBACK}:{self.port}"

    def is_ours(self) -> bool:
        """True if ``pid`` is alive and still runs the command we started.

        A PID can be reused by an unrelated process after ours exited; that one must never
        be signalled, so the command line has to match exactly.
        """
        if self.process is not None and self.process.popen is not None:
            return self.process.alive()
        if not ServerProcess(self.name, self.pid, self.port, self.log_path).alive():
            return False
        return bool(self.cmdline) and process_cmdline(self.pid) == self.cmdline

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"pid": self.pid, "port": self.port, "cmdline": self.cmdline,
                               "log": str(self.log_path), "grace": self.grace}
        if self.data_dir is not None:
            out["data_dir"] = str(self.data_dir)
        return out

    @classmethod
    def from_json(cls, name: str, data: Mapping[str, Any]) -> ServerRecord:
        data_dir = data.get("data_dir")
        return cls(name, int(data["pid"]), int(data["port"]), str(data["cmdline"]),
                   Path(str(data["log"])), None,
                   float(data.get("grace", STOP_GRACE_SECONDS)),
                   Path(str(data_dir)) if data_dir else None)


def stop_servers(records: Iterable[ServerRecord]) -> list[str]:
    """Stop the servers that are still ours; return the names that were running.

    All get SIGTERM at once (each broker needs seconds to exit), the ones still running
    after their ``grace`` get SIGKILL. Every signal is preceded by ``is_ours()``. Data
    directories of stopped servers are removed.
    """
    records = list(records)
    running = [r for r in records if r.is_ours()]
    for r in running:
        _signal(r, signal.SIGTERM)
    start = time.monotonic()
    while any(r.is_ours() and time.monotonic() < start + r.grace for r in running):
        time.sleep(0.05)
    stubborn = [r for r in running if r.is_ours()]
    for r in stubborn:
        log.warning("%s (pid %d) did not exit on SIGTERM, sending SIGKILL", r.name, r.pid)
        _signal(r, signal.SIGKILL)
    deadline = time.monotonic() + KILL_WAIT_SECONDS
    while time.monotonic() < deadline and any(r.is_ours() for r in stubborn):
        time.sleep(0.05)
    for r in running:
        if r.process is not None and r.process.popen is not None:
            r.process.popen.wait(timeout=KILL_WAIT_SECONDS)  # reap our child
        if r.is_ours():
            raise StackError(f"{r.name} (pid {r.pid}) is still running after SIGKILL")
        log.info("stopped %s (pid %d)", r.name, r.pid)
    for r in records:
        if r.data_dir is not None and not r.is_ours():
            shutil.rmtree(r.data_dir, ignore_errors=True)
    return [r.name for r in running]


def _signal(r: ServerRecord, sig: signal.Signals) -> None:
    try:
        os.kill(r.pid, sig)
    except ProcessLookupError:
        log.debug("%s (pid %d) already gone before %s", r.name, r.pid, sig.name)


class LocalStack:
    """A running embedded stack (see the module docstring).

    Build one with ``start`` (starts everything) or ``load`` (reads ``state.json`` written by
    another process, e.g. ``replicator local up``).
    """

    def __init__(self, directory: Path, servers: dict[str, ServerRecord],
                 info: Mapping[str, Any]) -> None:
        self.dir = directory
        self.servers = servers
        self.info = dict(info)

    # --- lifecycle --------------------------------------------------------------------

    @classmethod
    def start(cls, directory: str | Path = DEFAULT_DIR, *, topic: str = TOPIC,
              partitions: int = PARTITIONS, kafka: BrokerKind = DEFAULT_BROKER) -> LocalStack:
        """Start the servers, create buckets, queue, notifications and topic, write configs.

        Args:
            directory: state file, generated configs and server logs.
            topic: the source topic to create.
            partitions: its partition count.
            kafka: the brokers to run, ``tansu`` or ``apache`` (Apache Kafka from
                ``$KAFKA_HOME``, extra broker settings from ``$KAFKA_EXTRA_PROPS``).

        Raises:
            FatalError: ``apache`` without a usable ``$KAFKA_HOME`` (nothing was started).
            StackError: a state file already exists in ``directory``, or a server did not
                come up (everything started so far is stopped again).
            ReplicatorError: bucket, queue or topic setup failed (servers are stopped).
        """
        kind = check_broker_kind(kafka)
        d = Path(directory).absolute()
        if (d / STATE_FILE).exists():
            raise StackError(f"{d / STATE_FILE} exists: the stack is already up "
                             "(run `replicator local down` first)")
        d.mkdir(parents=True, exist_ok=True)
        logs = d / "logs"
        stack = cls(d, {}, {"topic": topic, "partitions": partitions, "kafka": kind})
        try:
            for name in broker_names(kind):
                stack.servers[name] = ServerRecord.of(start_broker(kind, name, logs),
                                                      stop_seconds(kind))
                stack._write_state()  # from now on `down` can stop what runs, whatever happens
            stack.servers["moto"] = ServerRecord.of(start_moto(logs))
            stack._write_state()
            stack._provision()
            stack._write_configs()
            stack._write_state()
        except BaseException:
            # Includes KeyboardInterrupt: never leave half a stack running.
            stop_servers(stack.servers.values())
            stack.remove_state()
            raise
        log.info("local stack up in %s", d)
        return stack

    @classmethod
    def load(cls, directory: str | Path = DEFAULT_DIR) -> LocalStack | None:
        """The stack recorded in ``directory/state.json``, or ``None`` if there is none.

        Raises:
            StackError: the state file is not readable or not ours.
        """
        d = Path(directory).absolute()
        path = d / STATE_FILE
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise StackError(f"cannot read {path}: {e}") from e
        try:
            if data.get("version") != STATE_VERSION:
                raise StackError(f"{path}: unknown state version {data.get('version')!r}")
            servers = {name: ServerRecord.from_json(name, s)
                       for name, s in data["servers"].items()}
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise StackError(f"{path} is not a local stack state file: {e!r}") from e
        return cls(d, servers, data)

    def running(self) -> dict[str, bool]:
        """Server name -> whether it is still running (and still ours)."""
        return {name: r.is_ours() for name, r in self.servers.items()}

    def is_up(self) -> bool:
        """True if every server is running."""
        return all(self.running().values())

    def stop(self) -> list[str]:
        """Stop our servers (only PIDs whose command line matches), remove the state file.

        Returns:
            The names of the servers that were still running.
        """
        stopped = stop_servers(self.servers.values())
        self.remove_state()
        return stopped

    def remove_state(self) -> None:
        """Delete ``state.json`` and the generated configs (they name dead ports)."""
        for path in [self.state_path, *self.config_paths.values()]:
            path.unlink(missing_ok=True)

    # --- what it offers ---------------------------------------------------------------

    @property
    def state_path(self) -> Path:
        """``dir/state.json``."""
        return self.dir / STATE_FILE

    @property
    def config_paths(self) -> dict[Role, Path]:
        """Role -> TOML config file written by ``start``."""
        return {role: self.dir / f"{role}.toml" for role in ROLES}

    @property
    def endpoints(self) -> dict[str, str]:
        """``source_kafka``/``destination_kafka`` (bootstrap.servers), ``s3``/``sqs`` (URLs).

        Only the servers started so far appear (all four once ``start`` returned).
        """
        out: dict[str, str] = {}
        source, destination = broker_names(self.kafka)
        if source in self.servers:
            out["source_kafka"] = self.servers[source].address
        if destination in self.servers:
            out["destination_kafka"] = self.servers[destination].address
        if "moto" in self.servers:
            out["s3"] = out["sqs"] = f"http://{self.servers['moto'].address}"
        return out

    @property
    def kafka(self) -> BrokerKind:
        """The kind of the stack's brokers (``tansu`` for state files written before)."""
        kind = self.info.get("kafka", DEFAULT_BROKER)
        return "apache" if kind == "apache" else "tansu"

    @property
    def topic(self) -> str:
        """The source topic created on the source broker."""
        return str(self.info.get("topic", TOPIC))

    @property
    def destination_topic(self) -> str:
        """Where ingress replays ``topic`` in the destination region."""
        return f"{self.topic}.copy"

    def settings_for(self, role: Role, environ: Mapping[str, str] | None = None) -> Settings:
        """Load the config written for ``role`` (no environment overrides unless given)."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
        return load_settings(self.config_paths[role], environ=environ or {})

    def s3_client(self, region: str) -> Any:
        """A boto3 S3 client on the stack's moto server (through the S3 seam)."""
        return s3.make_s3_client(endpoint_url=self.endpoints["s3"], region=region,
                                 access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY)

    def sqs_client(self, region: str = DEST_REGION) -> Any:
        """A boto3 SQS client on the stack's moto server (through the SQS seam)."""
        return sqs.make_sqs_client(endpoint_url=self.endpoints["sqs"], region=region,
                                   access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY)

    def summary(self) -> str:
        """What is running and how to use and stop it, for people."""
        ep = self.endpoints
        running = self.running()
        brokers = "Apache Kafka" if self.kafka == "apache" else "Tansu"
        lines = [f"Local stack with {brokers} brokers (state in {self.state_path})", ""]
        for name, r in self.servers.items():
            state = "running" if running[name] else "NOT RUNNING"
            lines.append(f"  {name:<18} {r.address:<16} pid {r.pid:<8} {state:<12} "
                         f"log {r.log_path}")
        lines += [
            "",
            f"  Kafka {SOURCE_REGION} (source):       bootstrap.servers={ep['source_kafka']}",
            f"  Kafka {DEST_REGION} (destination):  bootstrap.servers={ep['destination_kafka']}",
            f"  S3 + SQS endpoint:               {ep['s3']}  (access key test / secret test)",
            f"  Buckets:  s3://{SOURCE_BUCKET} ({SOURCE_REGION}),  "
            f"s3://{DEST_BUCKET} ({DEST_REGION})",
            f"  Queue:    {QUEUE} ({DEST_REGION}), gets s3://{DEST_BUCKET}/{DATA_PREFIX}/ "
            "ObjectCreated/ObjectRemoved events",
            f"  Topic:    {self.topic} ({self.info.get('partitions', PARTITIONS)} partitions) "
            f"on the source broker; ingress replays it into {self.destination_topic}",
            "",
            "  Configs:",
        ]
        for role, path in self.config_paths.items():
            lines.append(f"    replicator-{role:<11} --config {path}")
        lines += ["", "  Stop it with:  replicator local down"
                  + ("" if self.dir == DEFAULT_DIR.absolute() else f" --dir {self.dir}")]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """The state file's content."""
        return {
            "version": STATE_VERSION,
            "created_at": self.info.get("created_at") or datetime.now(UTC).isoformat(),
            "dir": str(self.dir),
            "kafka": self.kafka,
            "servers": {name: r.to_json() for name, r in self.servers.items()},
            "endpoints": self.endpoints,
            "buckets": {SOURCE_REGION: SOURCE_BUCKET, DEST_REGION: DEST_BUCKET},
            "queue": self.info.get("queue", {"name": QUEUE}),
            "topic": self.topic,
            "partitions": int(self.info.get("partitions", PARTITIONS)),
            "metrics_ports": self.info.get("metrics_ports", {}),
            "configs": {role: str(p) for role, p in self.config_paths.items()},
        }

    # --- setup steps ------------------------------------------------------------------

    def _provision(self) -> None:
        """Buckets, lifecycle rules, queue, notifications (through the S3/SQS seams), topic."""
        src = self.s3_client(SOURCE_REGION)
        dst = self.s3_client(DEST_REGION)
        aws.create_bucket(src, SOURCE_BUCKET, SOURCE_REGION)
        aws.create_bucket(dst, DEST_BUCKET, DEST_REGION)
        for client, bucket in ((src, SOURCE_BUCKET), (dst, DEST_BUCKET)):
            aws.set_lifecycle_for_temp(client, bucket, TEMP_PREFIX, days=1)
        sqs_client = self.sqs_client(DEST_REGION)
        url = aws.create_queue(sqs_client, QUEUE, source_bucket=DEST_BUCKET)
        arn = sqs.SqsQueue(sqs_client, QUEUE).arn
        aws.set_bucket_notifications(dst, DEST_BUCKET, arn, prefix=f"{DATA_PREFIX}/")
        self.info["queue"] = {"name": QUEUE, "url": url, "arn": arn, "region": DEST_REGION}
        log.info("buckets %s (%s), %s (%s), queue %s ready", SOURCE_BUCKET, SOURCE_REGION,
                 DEST_BUCKET, DEST_REGION, arn)
        # A metadata round trip proves each broker speaks Kafka, not only that its port is open.
        source = Admin(KafkaSettings(brokers=self.endpoints["source_kafka"]), timeout=20)
        source.create_topic(self.topic, int(self.info.get("partitions", PARTITIONS)))
        Admin(KafkaSettings(brokers=self.endpoints["destination_kafka"]),
              timeout=20).list_topics()

    def _write_configs(self) -> None:
        ports = {role: free_port() for role in ROLES}
        self.info["metrics_ports"] = ports
        for role in ROLES:
            path = self.config_paths[role]
            path.write_text(render_config(role, self.endpoints, topic=self.topic,
                                          metrics_port=ports[role]))
            try:
                self.settings_for(role)
            except ReplicatorError as e:  # a bug in render_config, not a user error
                raise StackError(f"the generated {path} does not validate: {e}") from e

    def _write_state(self) -> None:
        self.info["created_at"] = datetime.now(UTC).isoformat()
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        tmp.replace(self.state_path)


# --- configs -------------------------------------------------------------------------


def _toml_str(s: str) -> str:
    return json.dumps(s)  # a JSON string is a valid TOML basic string


def _toml_table(d: Mapping[str, Any]) -> str:
    items = ", ".join(f"{_toml_str(k)} = {json.dumps(v)}" for k, v in d.items())
    return "{ " + items + " }"


def render_config(role: Role, endpoints: Mapping[str, str], *, topic: str = TOPIC,
                  metrics_port: int = 0) -> str:
    """The TOML config of one controller on the local stack (SPEC 3.4).

    Thresholds are small so a demo sees segments within seconds: segments close after 2 s,
    ingress waits seconds (not the production hour) for late segments, and compaction
    merges any two segments older than 10 s, every minute.
    """
    region = DEST_REGION if role == "ingress" else SOURCE_REGION
    bucket = DEST_BUCKET if role == "ingress" else SOURCE_BUCKET
    brokers = endpoints["destination_kafka" if role == "ingress" else "source_kafka"]
    head = f"""# Written by `replicator local up` for the embedded stack; {role} in {region}.
# Any value can be overridden with REPLICATOR_<SECTION>__<KEY> environment variables.
region = {_toml_str(region)}

[s3]
bucket = {_toml_str(bucket)}
prefix = {_toml_str(DATA_PREFIX)}
temp_prefix = {_toml_str(TEMP_PREFIX)}
endpoint_url = {_toml_str(endpoints["s3"])}
access_key_id = {_toml_str(ACCESS_KEY)}
secret_access_key = {_toml_str(SECRET_KEY)}

[kafka]
brokers = {_toml_str(brokers)}
# Short group timeouts: joins and rebalances take seconds, not the librdkafka defaults.
config = {_toml_table(FAST_GROUP_CONFIG)}

[format]
name = "parquet"
compression = "zstd"

[metrics]
host = "127.0.0.1"
port = {metrics_port}

[log]
level = "INFO"
"""
    if role == "egress":
        body = f"""
[egress]
group_id = "replicator.egress"

[egress.topics.{_toml_str(topic)}]
max_segment_messages = 10000
max_segment_size = "1MiB"
max_segment_age = "2s"
"""
    elif role == "ingress":
        body = f"""
[ingress]
group_id = "replicator.ingress"
sqs_queue = {_toml_str(QUEUE)}
sqs_endpoint_url = {_toml_str(endpoints["sqs"])}
segment_events_topic = "replicator.segmentevents"
segment_events_retention = "1h"
checkpoint_topic = "replicator.checkpoint"
delivery = "exactly-once"

[[ingress.sources]]
region = {_toml_str(SOURCE_REGION)}
topic = {_toml_str(topic)}
destination_topic = {_toml_str(topic + ".copy")}
lost_segment_timeout = "30s"
late_segment_retries = 3
first_segment_delay = "2s"
"""
    else:
        body = f"""
[compaction]
schedule = "* * * * *"
parallelism = 2
spark_master = "local[2]"
spark_conf = {{ "spark.ui.enabled" = "false", "spark.driver.host" = "127.0.0.1" }}

[compaction.topics.{_toml_str(topic)}]
min_level = 0
max_level = 0
min_segment_age = "10s"
min_segment_count = 2
min_segment_size = 1
max_segment_count = 1000
max_segment_size = "1GiB"
batch_size = 10000
delete = true
"""
    return head + body
