"""Where MirrorMaker 2 stopped: the destination's records matched to the archived source.

MirrorMaker 2 does not keep offsets (its copy of a source partition has offsets of its own)
and does not write the source offset into the records. What it keeps is the record: key,
value, headers and timestamp (CreateTime). The segments egress archived hold the same
records with their source offsets. ``align`` walks the destination partition in order and
matches each record to a source record by that content (a 16-byte digest,
``replicator.ops.verify.digest``), so the source offset of every destination record MM2
wrote in the archived window is known exactly, and with it the first source offset not yet
in the destination (where ingress starts: docs/migrating-from-mirrormaker.md).

Pure: no I/O. The rules, each a refusal (``AlignmentError``) rather than a guess:

* a record is placed by content alone only when the records after it confirm the place (the
  next ``confirm`` destination records equal the source records after the candidate): two
  places that both fit is ambiguous;
* destination records that are not in the segments are older than them (MM2 copied them
  before egress started, or sent them again after a restart) or another producer's: they
  count as ``head`` (before the first aligned record) or ``unplaced`` (after it), never
  as an offset;
* the last destination record must be aligned: otherwise the segments do not reach MM2's
  last copy yet (egress has not archived it) and the start cannot be known.

What MM2 did is reported, not corrected: ``rewinds`` (a record written again, at least once
after a restart of MM2: the destination has duplicates before the cutover point) and
``skipped`` (source records MM2 never wrote: a gap before the cutover point).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from replicator.core.errors import FatalError
from replicator.core.offset_map import OffsetMapEntry, entries_of

CONFIRM = 8
"""Destination records after a record that must follow its candidate place in the source."""

Digest = bytes
Row = tuple[int, Digest]
"""``(offset, digest)`` of one record (source or destination)."""


class AlignmentError(FatalError):
    """The destination cannot be matched to the segments without a guess (the message says
    where and why).
    """


@dataclass(frozen=True)
class Alignment:
    """The destination records of the archived window with their source offsets.

    ``pairs``: ``(source index, destination offset)``, destination order, where ``source
    index`` indexes the ``source`` rows given to ``align``.
    """

    pairs: list[tuple[int, int]] = field(default_factory=list)
    head: int = 0
    rewinds: int = 0
    skipped: list[tuple[int, int]] = field(default_factory=list)
    """Source offset ranges (first, last) MM2 never wrote between two aligned records."""
    unplaced: int = 0
    """Records after the first aligned one that are not in the segments (MM2 went back to
    before them, or another producer wrote them); the records after them are placed as
    usual."""

    @property
    def aligned(self) -> bool:
        return bool(self.pairs)


def _run(c: int, dest: Sequence[Row], i: int, source: Sequence[Row], confirm: int) -> int:
    """How many destination records from ``i`` on equal the source records from ``c`` on
    (up to ``confirm``).
    """
    n = 0
    while n < confirm and i + n < len(dest) and c + n < len(source) \
            and dest[i + n][1] == source[c + n][1]:
        n += 1
    return n


def align(dest: Sequence[Row], source: Sequence[Row], *, confirm: int = CONFIRM,
          where: str = "") -> Alignment:
    """Match destination rows (destination offset order) to source rows (source offset
    order, one segment cover: no offset twice).

    Raises:
        AlignmentError: a record placed ambiguously, or a last record not aligned.
    """
    index: dict[Digest, list[int]] = {}
    for k, (_, dg) in enumerate(source):
        index.setdefault(dg, []).append(k)
    pairs: list[tuple[int, int]] = []
    skipped: list[tuple[int, int]] = []
    head = rewinds = unplaced = 0
    pos: int | None = None          # the source index expected next
    for i, (d_off, dg) in enumerate(dest):
        if pos is not None and pos < len(source) and source[pos][1] == dg:
            pairs.append((pos, d_off))
            pos += 1
            continue
        if dg not in index:
            # Copied before the segments begin (before the first aligned record, or sent
            # again by MM2 from there), or written by another producer: not placed.
            if pos is None:
                head += 1
            else:
                unplaced += 1
            continue
        c = _jump(index[dg], dest, i, source, confirm, where)
        if pos is not None:
            if c < pos:
                rewinds += 1
            elif c > pos:
                skipped.append((source[pos][0], source[c - 1][0]))
        pairs.append((c, d_off))
        pos = c + 1
    if dest and (not pairs or pairs[-1][1] != dest[-1][0]):
        raise AlignmentError(
            f"{where}none of the destination's last records is in the segments: egress has "
            "not archived MirrorMaker 2's last copy yet (wait until the segments reach past "
            "the source's end when MM2 stopped), or egress started after it")
    return Alignment(pairs, head, rewinds, skipped, unplaced)


def _jump(cands: Sequence[int], dest: Sequence[Row], i: int, source: Sequence[Row],
          confirm: int, where: str) -> int:
    """The one source index among ``cands`` (the records of its content) where destination
    record ``i`` sits when it is not the one expected: the first record aligned, a rewind or
    a gap of MM2.

    Raises:
        AlignmentError: more than one place fits.
    """
    d_off = dest[i][0]
    # The place whose run of equal records after it is the longest (MM2 may go back or
    # on right after the record, so a short run alone refuses nothing); a tie is a guess.
    runs = {c: _run(c, dest, i, source, confirm) for c in cands}
    best = max(runs.values())
    fits = [c for c, n in runs.items() if n == best]
    if len(fits) != 1:
        offsets = [source[c][0] for c in (fits or cands)[:5]]
        raise AlignmentError(
            f"{where}destination offset {d_off}: the record fits "
            f"several places of the source (source offsets "
            f"{offsets}) when the {confirm} records after it are compared: cannot place "
            "it without a guess")
    return fits[0]


def map_entries(alignment: Alignment, source: Sequence[Row], *, incarnation: str | None,
                source_incarnation: str) -> list[OffsetMapEntry]:
    """Offset-map entries of the aligned records: one per run of records consecutive in
    both the destination and the source rows (positions between two source rows are holes:
    no record exists there). A rewind starts a new run whose source range goes back, which
    ``live_entries`` reads as a replay that started again (older runs are dropped); a gap
    MM2 left is not covered (an offset in it is ``unmapped``).
    """
    out: list[OffsetMapEntry] = []
    run: list[tuple[int, int]] = []

    def flush() -> None:
        if run:
            out.extend(entries_of([source[k][0] for k, _ in run], run[0][1],
                                  incarnation=incarnation,
                                  source_incarnation=source_incarnation))
            run.clear()

    for k, d in alignment.pairs:
        if run and not (k == run[-1][0] + 1 and d == run[-1][1] + 1):
            flush()
        run.append((k, d))
    flush()
    return out
