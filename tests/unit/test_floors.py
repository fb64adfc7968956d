"""The floors of the house are kept: every import of our code, walked from the sources.

docs/architecture.md, "Floors": ``replicator.core`` is the ground floor and imports nothing
of ours above it; ``formats`` stands on the core; the services (``egress``, ``ingress``,
``compaction``) stand on the core and ``formats`` and never import each other; the operator
tools (``replicator.ops``) and the archive tables (``replicator.archive``) depend on the
core and ``formats`` only; the dev stack, the
reference generators, the CLI and the ``replicator`` facade are the top floor. The core
holds only what services import.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("replicator", "formats", "egress", "ingress", "compaction")
CORE = "replicator.core"
SERVICES = ("egress", "ingress", "compaction")

# What each floor may import of ours (besides itself).
ALLOWED: dict[str, tuple[str, ...]] = {
    CORE: (CORE,),
    "formats": (CORE, "formats"),
    "egress": (CORE, "formats", "egress"),
    "ingress": (CORE, "formats", "ingress"),
    "compaction": (CORE, "formats", "compaction"),
    "replicator.ops": (CORE, "formats", "replicator.ops"),
    "replicator.archive": (CORE, "formats", "replicator.archive"),
    "replicator.reference": (CORE, "formats", *SERVICES, "replicator.ops",
                             "replicator.archive", "replicator.reference"),
    "replicator.devstack": (CORE, "formats", *SERVICES, "replicator.ops",
                            "replicator.archive", "replicator.devstack"),
    "replicator.cli": PACKAGES,
    "replicator": (CORE, *SERVICES),  # the facade (replicator/__init__.py)
}
# Entry-point files that live in a service's folder but are top floor by role.
ENTRY_POINTS = {
    # spark-submit's driver script (deploy/compaction/spark-submit.sh): the compaction CLI.
    "compaction.__main__": PACKAGES,
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def our_modules() -> dict[str, Path]:
    return {module_name(f): f for pkg in PACKAGES for f in (ROOT / pkg).rglob("*.py")}


def imports_of(path: Path) -> Iterator[str]:
    """Every absolute import of ours in the file, function-local ones included."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        yield from (n for n in names if n.split(".")[0] in PACKAGES)


def floor_of(module: str) -> str:
    """The most specific floor ``module`` belongs to."""
    return max((f for f in ALLOWED if module == f or module.startswith(f + ".")), key=len)


def within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


@pytest.mark.parametrize("module", sorted(our_modules()))
def test_imports_stay_on_their_floor_or_below(module: str) -> None:
    path = our_modules()[module]
    allowed = ENTRY_POINTS.get(module) or ALLOWED[floor_of(module)]
    wrong = sorted({name for name in imports_of(path) if not within(name, allowed)
                    # "from replicator import x" names a module of the package.
                    and not (floor_of(module) != "replicator" and name == "replicator")})
    assert not wrong, f"{module} (floor {floor_of(module)}) imports {wrong}"


def test_a_service_never_imports_another_service() -> None:
    for module, path in our_modules().items():
        service = module.split(".")[0]
        if service in SERVICES and module not in ENTRY_POINTS:
            others = {n for n in imports_of(path) if n.split(".")[0] in SERVICES} - {service}
            bad = {n for n in others if not n.startswith(service)}
            assert not bad, f"{module} imports {sorted(bad)}"


def test_the_core_holds_only_what_the_services_import() -> None:
    modules = our_modules()
    reached: set[str] = set()
    todo = [m for m in modules
            if m.split(".")[0] in (*SERVICES, "formats") and m not in ENTRY_POINTS]
    while todo:
        m = todo.pop()
        if m in reached or m not in modules:
            continue
        reached.add(m)
        for name in imports_of(modules[m]):
            # "from a.b import c" is module a.b.c or name c of module a.b.
            todo += [name, name.rsplit(".", 1)[0]]
    core = {m for m in modules if within(m, (CORE,)) and modules[m].name != "__init__.py"}
    unused = sorted(core - reached)
    assert not unused, f"core modules no service imports (move them up a floor): {unused}"


def test_the_walk_sees_a_forbidden_import(tmp_path: Path) -> None:
    """The check can fail: a core module importing a service is caught."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from egress.controller import Egress\n")
    names = list(imports_of(bad))
    assert names and not within(names[0], ALLOWED[CORE])
