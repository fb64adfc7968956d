"""Links between the documents resolve: every relative Markdown link names a file of the
repository and, with an anchor, a heading of that file (GitHub's anchors); every citation
of a README section by its title (README, then the title in quotes) names a heading the
README has.
The README is the front door and its detail lives in docs/: a section moved out of it must
not leave a link or a citation pointing at nothing."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SKIP = {".git", ".venv", ".venv-ci", "node_modules", ".local-stack", ".mypy_cache",
        ".ruff_cache", ".pytest_cache", "build", "dist"}
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")
README_CITATION = re.compile(r"README(?:'s)?,? [\"“]([^\"”]+)[\"”]")


def _files(*suffixes: str) -> list[Path]:
    return sorted(p for p in ROOT.rglob("*")
                  if p.suffix in suffixes and p.is_file()
                  and not SKIP.intersection(p.relative_to(ROOT).parts))


def _prose(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in _prose(path.read_text()):
        out.update(re.findall(r'<a (?:id|name)="([^"]+)"', line))
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def test_slugs_follow_github() -> None:
    assert slug("Destination limits (`limits.py`)") == "destination-limits-limitspy"
    assert slug("4.7 The archive committer") == "47-the-archive-committer"
    assert slug("Verified here, and what needs a real Kafka or AWS") == \
        "verified-here-and-what-needs-a-real-kafka-or-aws"


def test_every_relative_link_resolves() -> None:
    broken = []
    for doc in _files(".md"):
        for line in _prose(doc.read_text()):
            for target in LINK.findall(line):
                if re.match(r"^[a-z]+:", target):
                    continue            # http:, https:, mailto:
                path, _, anchor = target.partition("#")
                dest = (doc.parent / path).resolve() if path else doc
                rel = doc.relative_to(ROOT)
                if not dest.exists():
                    broken.append(f"{rel}: {target} (no such file)")
                elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                    broken.append(f"{rel}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_every_readme_citation_names_a_readme_heading() -> None:
    headings = anchors(ROOT / "README.md")
    stale = [f"{p.relative_to(ROOT)}: README, \"{title}\""
             for p in _files(".md", ".py", ".yaml", ".toml", ".sh")
             for title in README_CITATION.findall(re.sub(r"\s+", " ", p.read_text()))
             if slug(title) not in headings]
    assert not stale, "\n".join(stale)
