"""py-spy's collapsed stacks (``--format raw``) → a flame graph SVG and a table of shares.

    .venv/bin/python bench/flame.py PROFILE.raw [--svg OUT.svg] [--top 30] [--title T]

``py-spy record --format raw`` writes one line per distinct stack: ``frame;frame;... N``
(root first; with ``--threads`` the first frame names the thread). Frames are merged
without their line numbers. ``shares`` gives, per function, the share of all samples in
which it is on the stack (inclusive) and at the top of it (self); ``render_svg`` draws the
merged tree (root at the bottom, width = samples), one ``<title>`` per box for hovering.
Pure functions (``parse``, ``normalize``, ``shares``) are unit-tested.
"""

from __future__ import annotations

import argparse
import hashlib
import html
import re
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

_LINE = re.compile(r"^(.*)\s+(\d+)$")
_LINENO = re.compile(r"^(.*) \(([^()]*?):\d+\)$")
_ADDRESS = re.compile(r"^0x[0-9a-f]+ \((.*)\)$")

Stack = tuple[tuple[str, ...], int]


def normalize(frame: str) -> str:
    """``f (file.py:12)`` → ``f (file.py)``; ``0x7f.. (libc.so.6)`` → ``[libc.so.6]``."""
    m = _ADDRESS.match(frame)
    if m:
        return f"[{m.group(1)}]"
    m = _LINENO.match(frame)
    if m:
        return f"{m.group(1)} ({m.group(2)})"
    return frame


def parse(lines: Iterable[str]) -> list[Stack]:
    """Collapsed-stack lines → (normalized frames root first, samples)."""
    out: list[Stack] = []
    for line in lines:
        m = _LINE.match(line.rstrip("\n"))
        if m is None or not m.group(1):
            continue
        out.append((tuple(normalize(f) for f in m.group(1).split(";")), int(m.group(2))))
    return out


def thread_of(stack: Sequence[str]) -> str | None:
    """The thread name of a ``--threads`` stack (``thread (123): name`` → ``name``)."""
    if stack and stack[0].startswith("thread ("):
        return stack[0].split(": ", 1)[-1]
    return None


def shares(stacks: Sequence[Stack], *, skip_threads: bool = True
           ) -> tuple[int, dict[str, float], dict[str, float]]:
    """(total samples, inclusive share by frame, self share by frame).

    A frame counted once per sample however often it recurs in the stack; thread frames
    (``--threads``) are left out when ``skip_threads``.
    """
    total = sum(n for _, n in stacks)
    incl: Counter[str] = Counter()
    own: Counter[str] = Counter()
    for frames, n in stacks:
        fs = frames[1:] if skip_threads and thread_of(frames) is not None else frames
        if not fs:
            continue
        for f in set(fs):
            incl[f] += n
        own[fs[-1]] += n
    if not total:
        return 0, {}, {}
    return (total, {k: v / total for k, v in incl.items()},
            {k: v / total for k, v in own.items()})


WAITS = re.compile(r"^(pthread_cond_(timed)?wait|cnd_(timed)?wait|poll|epoll_wait|select|"
                   r"__select|sem_(timed)?wait|futex_wait|__futex_abstimed_wait_common|"
                   r"PyThread_acquire_lock_timed|nanosleep|clock_nanosleep|accept4?|recv|"
                   r"recvfrom|read|__lll_lock_wait(_private)?)\b")
"""Leaf frames of a thread that waits instead of running. py-spy ``--native`` samples idle
threads too (its idle detection is off then), so waits would fill most of the graph."""


def busy(stacks: Sequence[Stack]) -> list[Stack]:
    """The samples of running threads: stacks whose innermost named frame (unresolved
    ``[lib.so]`` addresses below it skipped: the system call) is not a wait (``WAITS``)."""
    out: list[Stack] = []
    for frames, n in stacks:
        named = [f for f in frames if not f.startswith("[")]
        if named and not WAITS.match(named[-1]):
            out.append((frames, n))
    return out


def thread_names(stacks: Sequence[Stack]) -> dict[int, str]:
    """OS thread id -> Python thread name, from ``thread (TID): name`` frames."""
    out: dict[int, str] = {}
    for frames, _ in stacks:
        m = re.match(r"thread \((0x[0-9a-f]+|\d+)\): (.*)$", frames[0]) if frames else None
        if m:
            out[int(m.group(1), 0)] = m.group(2)
    return out


def by_thread(stacks: Sequence[Stack]) -> dict[str, float]:
    """Share of samples per thread name (``--threads`` stacks); digits folded to ``N``."""
    total = sum(n for _, n in stacks)
    out: Counter[str] = Counter()
    for frames, n in stacks:
        name = thread_of(frames) or "?"
        out[re.sub(r"\d+", "N", name)] += n
    return {k: v / total for k, v in out.most_common()} if total else {}


def top_table(stacks: Sequence[Stack], n: int = 30) -> str:
    """The ``n`` frames with the largest self share, with their inclusive share."""
    total, incl, own = shares(stacks)
    lines = [f"{total} samples", f"{'self':>6} {'incl':>6}  frame"]
    for f, s in sorted(own.items(), key=lambda kv: -kv[1])[:n]:
        lines.append(f"{s:6.1%} {incl[f]:6.1%}  {f}")
    return "\n".join(lines)


# --- SVG -----------------------------------------------------------------------------


@dataclass
class Node:
    name: str
    samples: int = 0
    children: dict[str, Node] = field(default_factory=dict)


def tree(stacks: Sequence[Stack]) -> Node:
    root = Node("all")
    for frames, n in stacks:
        root.samples += n
        node = root
        for f in frames:
            child = node.children.get(f)
            if child is None:
                child = node.children[f] = Node(f)
            child.samples += n
            node = child
    return root


def _color(name: str) -> str:
    h = int(hashlib.md5(name.encode()).hexdigest()[:6], 16)
    if name.startswith("thread ("):
        return "rgb(200,200,200)"
    if ".py)" in name:   # Python: warm
        return f"rgb({205 + h % 50},{80 + (h >> 8) % 120},{40 + (h >> 16) % 40})"
    return f"rgb({80 + h % 60},{150 + (h >> 8) % 80},{190 + (h >> 16) % 60})"  # native: cool


def render_svg(stacks: Sequence[Stack], title: str, width: int = 1800, row: int = 16,
               min_px: float = 0.3) -> str:
    """A flame graph: root at the bottom, one row per stack depth, width ∝ samples."""
    root = tree(stacks)
    total = max(root.samples, 1)
    boxes: list[tuple[float, int, float, Node]] = []

    def walk(node: Node, x: float, depth: int) -> int:
        w = node.samples / total * (width - 20)
        if w < min_px:
            return depth
        boxes.append((x, depth, w, node))
        deepest = depth
        cx = x
        for child in sorted(node.children.values(), key=lambda c: c.name):
            deepest = max(deepest, walk(child, cx, depth + 1))
            cx += child.samples / total * (width - 20)
        return deepest

    depth = walk(root, 10.0, 0)
    height = (depth + 1) * row + 60
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="monospace" font-size="11">',
           '<rect width="100%" height="100%" fill="rgb(250,250,240)"/>',
           f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="15">'
           f'{html.escape(title)}</text>',
           f'<text x="10" y="40" fill="gray">{total} samples; hover a box for its share; '
           'warm = Python, cool = native</text>']
    for x, d, w, node in boxes:
        y = height - (d + 1) * row - 4
        share = node.samples / total
        label = html.escape(f"{node.name} ({node.samples} samples, {share:.2%})")
        out.append(f'<g><title>{label}</title><rect x="{x:.1f}" y="{y}" width="{w:.1f}" '
                   f'height="{row - 1}" fill="{_color(node.name)}" rx="1"/>')
        chars = int(w / 6.6)
        if chars >= 4:
            text = node.name if len(node.name) <= chars else node.name[:chars - 2] + ".."
            out.append(f'<text x="{x + 2:.1f}" y="{y + row - 4}">{html.escape(text)}</text>')
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raw", type=Path)
    ap.add_argument("--svg", type=Path, default=None)
    ap.add_argument("--title", default=None)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--all", action="store_true",
                    help="keep samples of waiting threads (default: only running ones)")
    args = ap.parse_args(argv)
    stacks = parse(args.raw.read_text().splitlines())
    if not args.all:
        stacks = busy(stacks)
    if args.svg is not None:
        args.svg.write_text(render_svg(stacks, args.title or args.raw.name))
    print(top_table(stacks, args.top))
    print("\nby thread: " + ", ".join(f"{k} {v:.1%}" for k, v in by_thread(stacks).items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
