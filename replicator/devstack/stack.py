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
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from replicator.core import s3, sqs
from replicator.core.errors import ReplicatorError
from replicator.core.kafka import Admin
from replicator.core.settings import KafkaSettings, Settings, load_settings
from replicator.devstack import aws
from replicator.devstack.configs import (
    ACCESS_KEY,
    DATA_PREFIX,
    DEST_BUCKET,
    DEST_REGION,
    PARTITIONS,
    QUEUE,
    ROLES,
    SECRET_KEY,
    SOURCE_BUCKET,
    SOURCE_REGION,
    TEMP_PREFIX,
    TOPIC,
    Role,
    render_config,
)
from replicator.devstack.processes import (
    DEFAULT_BROKER,
    BrokerKind,
    check_broker_kind,
    free_port,
    start_broker,
    start_moto,
    stop_seconds,
)
from replicator.devstack.servers import ServerRecord, StackError, broker_names, stop_servers

log = logging.getLogger(__name__)

STATE_FILE = "state.json"
STATE_VERSION = 1
DEFAULT_DIR = Path(".local-stack")


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
