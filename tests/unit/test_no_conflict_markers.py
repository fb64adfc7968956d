"""No merge-conflict markers in the repository's tracked text files.

A merge that commits ``<<<<<<<``/``>>>>>>>`` lines into a Markdown file breaks no other
test: the docs would ship with both sides of a conflict.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^(<{7}|>{7})( |$)|^={7}$", re.M)


def tracked_text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                         check=True).stdout.decode()
    return [ROOT / name for name in out.split("\0")
            if name.endswith((".py", ".md", ".toml", ".yaml", ".yml", ".sh", ".txt", ".cfg"))]


def test_no_tracked_file_holds_a_conflict_marker() -> None:
    files = tracked_text_files()
    assert files, "git ls-files listed nothing"
    bad = [f"{p.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}"
           for p in files if p.is_file()
           for text in [p.read_text(errors="replace")]
           for m in MARKER.finditer(text)]
    assert not bad, f"merge-conflict markers at {', '.join(bad)}"
