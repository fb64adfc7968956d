"""A three-node Apache Kafka cluster (KRaft) for the cluster tier: every node a broker and
a controller, one quorum of three, replication factor 3 and ``min.insync.replicas = 2``
for every topic, the internal ones included; nodes killed (SIGKILL of the JVM's process
group) and started again on their own data and ports.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from replicator.core.errors import ReplicatorError
from replicator.core.kafka import Admin
from replicator.core.settings import KafkaSettings
from replicator.devstack.processes import (
    LOOPBACK,
    _kafka_cluster_id,
    free_port,
    kafka_home,
    port_open,
)

NODES = 3
HEAP = "-Xmx320m -Xms64m"
"""Small heaps: three JVMs (and the tests' clients) on two cores."""

CLUSTER_PROPERTIES = """\
process.roles=broker,controller
node.id={node}
controller.quorum.voters={voters}
listeners=PLAINTEXT://{host}:{port},CONTROLLER://{host}:{controller_port}
advertised.listeners=PLAINTEXT://{host}:{port}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs={data_dir}
auto.create.topics.enable=false
num.partitions=1
default.replication.factor=3
min.insync.replicas=2
unclean.leader.election.enable=false
offsets.topic.replication.factor=3
offsets.topic.num.partitions=3
transaction.state.log.replication.factor=3
transaction.state.log.min.isr=2
transaction.state.log.num.partitions=3
share.coordinator.state.topic.replication.factor=3
share.coordinator.state.topic.min.isr=2
group.initial.rebalance.delay.ms=0
group.min.session.timeout.ms=1000
log.initial.task.delay.ms=0
# Fast enough for a test to see a dead node leave the ISR and come back.
replica.lag.time.max.ms=5000
broker.session.timeout.ms=4000
broker.heartbeat.interval.ms=500
controller.quorum.election.timeout.ms=1000
controller.quorum.fetch.timeout.ms=2000
# Less background work per JVM.
num.network.threads=2
num.io.threads=2
num.replica.fetchers=1
background.threads=2
log.cleaner.enable=false
"""


@dataclass
class Node:
    """One node: its ids, ports, data and (while it runs) its process."""

    node_id: int
    port: int
    controller_port: int
    config: Path
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None


@dataclass
class KafkaCluster:
    """Three KRaft nodes on loopback, started from ``$KAFKA_HOME``."""

    workdir: Path
    home: Path = field(default_factory=kafka_home)
    nodes: list[Node] = field(default_factory=list)
    _admin: Admin | None = None

    @property
    def admin(self) -> Admin:
        """One admin client for the cluster's questions (a client per question, created and
        destroyed while nodes are down, costs threads and connections)."""
        if self._admin is None:
            self._admin = Admin(self.kafka, timeout=10)
        return self._admin

    @property
    def brokers(self) -> str:
        return ",".join(n.address for n in self.nodes)

    @property
    def kafka(self) -> KafkaSettings:
        return KafkaSettings(brokers=self.brokers)

    def node(self, node_id: int) -> Node:
        return next(n for n in self.nodes if n.node_id == node_id)

    def _env(self) -> dict[str, str]:
        return {**os.environ, "KAFKA_HEAP_OPTS": HEAP, "KAFKA_JMX_OPTS": " ",
                "LOG_DIR": str(self.workdir / "logs"),
                # One JIT compiler thread and a serial GC: less CPU per idle JVM.
                "KAFKA_JVM_PERFORMANCE_OPTS": "-XX:+UseSerialGC -XX:CICompilerCount=2 "
                                              "-XX:TieredStopAtLevel=1 -Djava.awt.headless=true"}

    def start(self, timeout: float = 120.0) -> KafkaCluster:
        """Format and start every node; return once all three are brokers of the cluster."""
        ids = range(1, NODES + 1)
        ports = {i: (free_port(), free_port()) for i in ids}
        voters = ",".join(f"{i}@{LOOPBACK}:{ports[i][1]}" for i in ids)
        cid = _kafka_cluster_id()
        for i in ids:
            data = self.workdir / f"node{i}"
            data.mkdir(parents=True, exist_ok=True)
            conf = self.workdir / f"node{i}.properties"
            conf.write_text(CLUSTER_PROPERTIES.format(
                node=i, voters=voters, host=LOOPBACK, port=ports[i][0],
                controller_port=ports[i][1], data_dir=data))
            fmt = subprocess.run([str(self.home / "bin" / "kafka-storage.sh"), "format", "-t",
                                  cid, "-c", str(conf)], env=self._env(),
                                 stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                 check=False, timeout=120)
            if fmt.returncode != 0:
                raise RuntimeError(f"formatting node {i}: {fmt.stderr or fmt.stdout}")
            self.nodes.append(Node(i, ports[i][0], ports[i][1], conf,
                                   self.workdir / f"node{i}.log"))
        for n in self.nodes:
            self._spawn(n)
        self.wait_brokers(NODES, timeout)
        return self

    def _spawn(self, n: Node) -> None:
        n.starts += 1
        with open(n.log_path, "ab") as out:
            n.popen = subprocess.Popen(
                [str(self.home / "bin" / "kafka-server-start.sh"), str(n.config)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, env=self._env())

    def kill(self, node_id: int) -> None:
        """kill -9 of the node's process group (the JVM and its launcher)."""
        n = self.node(node_id)
        if n.popen is not None and n.popen.poll() is None:
            os.killpg(n.popen.pid, signal.SIGKILL)
            n.popen.wait(30)

    def stop(self, node_id: int, timeout: float = 30.0) -> None:
        """A clean shutdown (SIGTERM: leadership moved away first), SIGKILL after ``timeout``."""
        n = self.node(node_id)
        if n.popen is None or n.popen.poll() is not None:
            return
        os.killpg(n.popen.pid, signal.SIGTERM)
        try:
            n.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill(node_id)

    def restart(self, node_id: int, timeout: float = 90.0) -> None:
        """Start a stopped node on its data and ports; return once it serves clients."""
        n = self.node(node_id)
        assert not n.alive()
        self._spawn(n)
        deadline = time.monotonic() + timeout
        while not port_open(LOOPBACK, n.port):
            if not n.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"node {node_id} did not start; see {n.log_path}")
            time.sleep(0.2)

    def live_brokers(self) -> set[int]:
        """The node ids the cluster's metadata shows as brokers now."""
        try:
            return set(self.admin.cluster().broker_ids)
        except ReplicatorError:
            return set()

    def wait_brokers(self, count: int, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.live_brokers()) < count:
            dead = [n.node_id for n in self.nodes if n.popen is not None and not n.alive()]
            if dead and count == NODES:
                raise RuntimeError(f"node(s) {dead} exited; see {self.workdir}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"fewer than {count} brokers after {timeout:.0f}s")
            time.sleep(0.3)

    def leader(self, topic: str, partition: int) -> int:
        md = self.admin._admin.list_topics(topic=topic, timeout=10)
        return int(md.topics[topic].partitions[partition].leader)

    def isr(self, topic: str, partition: int) -> int:
        return self.admin.partition_replicas(topic)[partition][0]

    def wait_isr(self, topic: str, partitions: int, size: int = NODES,
                 timeout: float = 90.0) -> None:
        """Until every partition of ``topic`` has ``size`` in-sync replicas."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if all(self.isr(topic, p) >= size for p in range(partitions)):
                    return
            except (ReplicatorError, KeyError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{topic}: ISR below {size} after {timeout:.0f}s")
            time.sleep(0.3)

    def active_controller(self) -> int:
        desc = self.admin.cluster()
        assert desc.controller_id is not None
        return desc.controller_id

    def close(self) -> None:
        for n in self.nodes:
            if n.alive():
                assert n.popen is not None
                os.killpg(n.popen.pid, signal.SIGTERM)
        for n in self.nodes:
            if n.popen is not None:
                try:
                    n.popen.wait(20)
                except subprocess.TimeoutExpired:
                    os.killpg(n.popen.pid, signal.SIGKILL)
                    n.popen.wait(10)


def new_workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="kafka-cluster-"))


def remove(workdir: Path) -> None:
    shutil.rmtree(workdir, ignore_errors=True)


def quorum_leader(cluster: KafkaCluster) -> int:
    """The active controller: the KRaft quorum's leader (DescribeCluster names any broker
    as the "controller" to clients of a KRaft cluster, so the quorum is asked)."""
    out = subprocess.run([str(cluster.home / "bin" / "kafka-metadata-quorum.sh"),
                          "--bootstrap-server", cluster.brokers, "describe", "--status"],
                         env={**cluster._env(), "KAFKA_HEAP_OPTS": "-Xmx128m"},
                         capture_output=True, text=True, check=True, timeout=60).stdout
    for line in out.splitlines():
        if line.startswith("LeaderId:"):
            return int(line.split(":", 1)[1])
    raise RuntimeError(f"no LeaderId in: {out}")
