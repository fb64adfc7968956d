"""Compaction checks of ``replicator doctor``: the Java that Spark would start, and the
Spark master of ``compaction.spark_master``.

``java_check`` and ``spark_master_check`` are pure (they get ``java -version``'s output
and the result of a TCP connection); ``compaction_checks`` runs those with injected
functions (``java_version``, ``tcp_connect`` by default).
"""

from __future__ import annotations

import re
import socket
import subprocess
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from urllib.parse import urlsplit

from replicator.core.settings import CompactionSettings
from replicator.ops.doctor.report import Check, fail, passed, warn

JAVA = "java"
SPARK_MASTER = "spark master"

# Java versions each Spark major version runs on (Spark's own documentation: 3.x on 8, 11
# and 17; 4.x on 17 and 21).
_MIN_JAVA = {3: 8, 4: 17}


def java_major(version_output: str) -> int | None:
    """The major version in ``java -version``'s output (``"1.8.0_381"`` is 8)."""
    m = re.search(r'version "(\d+)(?:\.(\d+))?', version_output)
    if m is None:
        return None
    major = int(m.group(1))
    if major == 1 and m.group(2) is not None:
        return int(m.group(2))
    return major


def java_check(output: str | None, error: str | None, spark_version: str | None) -> Check:
    """FAIL without Java, or with one older than the installed Spark needs; FAIL without
    pyspark (the ``compaction`` extra).
    """
    if spark_version is None:
        return fail(JAVA, "pyspark is not installed",
                    "install the compaction extra (pip install 'kafka-s3-replicator"
                    "[compaction]'), or set compaction.spark_master = \"inline\"")
    if output is None:
        return fail(JAVA, f"no java: {error}",
                    "install a JDK (17 or 21 for Spark 4) and put it on PATH or in JAVA_HOME")
    major = java_major(output)
    first = output.strip().splitlines()[0] if output.strip() else "?"
    seen = f"{first}; pyspark {spark_version}"
    spark_major = int(spark_version.split(".")[0]) if spark_version[:1].isdigit() else 0
    needed = _MIN_JAVA.get(spark_major)
    if major is None:
        return warn(JAVA, seen, "could not read the Java version: check java -version")
    if needed is not None and major < needed:
        return fail(JAVA, seen, f"Spark {spark_major} needs Java {needed} or newer: install it "
                                "and put it on PATH or in JAVA_HOME")
    return passed(JAVA, seen)


def master_address(master: str) -> tuple[str, int] | None:
    """``(host, port)`` of a ``spark://`` or ``k8s://`` master, else ``None``."""
    if master.startswith("spark://"):
        first = master[len("spark://"):].split(",", maxsplit=1)[0]
        host, _, port = first.rpartition(":")
        return (host, int(port)) if port.isdigit() else (first, 7077)
    if master.startswith("k8s://"):
        url = urlsplit(master[len("k8s://"):] if "://" in master[len("k8s://"):]
                       else "https://" + master[len("k8s://"):])
        if url.hostname is None:
            return None
        return url.hostname, url.port or (443 if url.scheme == "https" else 80)
    return None


def spark_master_check(master: str, connect_error: str | None) -> Check:
    """PASS for ``inline``, local masters, the master from spark-submit (``""``) and a
    cluster master that accepts a TCP connection; FAIL when it does not.
    """
    if master == "inline":
        return passed(SPARK_MASTER, "inline: merges in this process, no Spark")
    if master == "":
        return passed(SPARK_MASTER, "taken from spark-submit")
    if master.startswith("local"):
        return passed(SPARK_MASTER, f"{master}: Spark in this process's JVM")
    addr = master_address(master)
    if addr is None:
        return warn(SPARK_MASTER, f"{master}: not a master the doctor knows how to reach",
                    "check compaction.spark_master (local[*], spark://host:port, "
                    "k8s://https://host:port, inline)")
    where = f"{addr[0]}:{addr[1]}"
    if connect_error is not None:
        return fail(SPARK_MASTER, f"{master}: cannot connect to {where}: {connect_error}",
                    "start the Spark master or fix compaction.spark_master")
    return passed(SPARK_MASTER, f"{master}: {where} accepts connections")


def java_version(java_home: str | None, timeout: float = 20.0) -> tuple[str | None, str | None]:
    """``java -version``'s output (Java prints it on stderr), or ``None`` and why not.

    ``$JAVA_HOME/bin/java`` when ``java_home`` is given (where Spark looks first), else
    ``java`` on PATH.
    """
    java = str(Path(java_home) / "bin" / "java") if java_home else "java"
    try:
        proc = subprocess.run([java, "-version"], capture_output=True, text=True,
                              timeout=timeout, check=False)
    except FileNotFoundError:
        return None, f"{java} not found"
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"{java} -version: {e}"
    if proc.returncode != 0:
        return None, f"{java} -version exited {proc.returncode}: {proc.stderr.strip()[:200]}"
    return proc.stderr or proc.stdout, None


def tcp_connect(host: str, port: int, timeout: float) -> str | None:
    """``None`` when ``host:port`` accepts a TCP connection within ``timeout``, else why not."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as e:
        return e.strerror or str(e) or type(e).__name__


def pyspark_version() -> str | None:
    """The installed pyspark's version (from its metadata: pyspark is not imported)."""
    try:
        return metadata.version("pyspark")
    except metadata.PackageNotFoundError:
        return None


def compaction_checks(compaction: CompactionSettings, *, java_home: str | None,
                      timeout: float,
                      java: Callable[[str | None], tuple[str | None, str | None]] = java_version,
                      connect: Callable[[str, int, float], str | None] = tcp_connect,
                      spark: Callable[[], str | None] = pyspark_version) -> list[Check]:
    """The Spark master and, unless compaction runs inline, Java and pyspark."""
    master = compaction.spark_master
    addr = master_address(master)
    out = [spark_master_check(master, None if addr is None else connect(*addr, timeout))]
    if master != "inline":
        output, error = java(java_home)
        out.append(java_check(output, error, spark()))
    return out
