"""The states of a replay worker (``ingress.worker``) and the moves between them: one enum,
one table, and ``ReplayStates.enter``, the only place the state changes (it checks the move
against the table and logs it).

A worker lives through many sessions (a sink, a checkpoint load, the replay from it). In
a session it is ``OPENING`` (the checkpoint load waits for the reader), then
``REPLAYING`` (replaying segments, or idle until one arrives), ``WAITING_FIRST`` (no
checkpoint, egress's first position not recorded yet), ``LATE`` (a gap after the position,
reloading until it fills or ``lost_segment_timeout``) or ``LOST`` (declaring the gap lost).
A session ends in one of the waits between sessions, each with its own reason and backoff:
``RESTARTING`` (it failed), ``REFUSED`` (the destination refused a record for good: the
partition stops at it), ``FENCED`` (the producer was fenced). ``STOPPING`` (the batch in
flight ends, the last checkpoints go out) ends in ``STOPPED``.

::

    NEW ──> OPENING ──> REPLAYING <──> WAITING_FIRST, LATE, LOST (the planner's choice,
                                      each step, between these four)
    (any session state) ──> RESTARTING | REFUSED | FENCED ──> OPENING
    (any state but STOPPED) ──> STOPPING ──> STOPPED
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from enum import Enum

log = logging.getLogger(__name__)


class ReplayState(Enum):
    """Where a replay worker is (see the module)."""

    NEW = "new"
    OPENING = "opening a session"
    WAITING_FIRST = "waiting for the partition's first position"
    REPLAYING = "replaying"
    LATE = "waiting for a late segment"
    LOST = "declaring a range lost"
    RESTARTING = "restarting after a failed session"
    REFUSED = "stopped at a refused record"
    FENCED = "fenced"
    STOPPING = "stopping"
    STOPPED = "stopped"


S = ReplayState

IN_SESSION = frozenset({S.OPENING, S.WAITING_FIRST, S.REPLAYING, S.LATE, S.LOST})
"""States with a session (a sink and its delivery)."""

BETWEEN_SESSIONS = frozenset({S.RESTARTING, S.REFUSED, S.FENCED})
"""States without a session that start the next one after their backoff."""

_ENDS = BETWEEN_SESSIONS | {S.STOPPING}
"""Where any session state may go when the session ends."""

_PLANNED = frozenset({S.WAITING_FIRST, S.REPLAYING, S.LATE, S.LOST})
"""The session states the planner chooses between at each step (``planner.next_action``)."""

TRANSITIONS: dict[ReplayState, frozenset[ReplayState]] = {
    S.NEW: frozenset({S.OPENING, S.STOPPING}),
    S.OPENING: frozenset({S.REPLAYING}) | _ENDS,
    S.REPLAYING: _PLANNED | _ENDS,
    S.WAITING_FIRST: _PLANNED | _ENDS,
    S.LATE: _PLANNED | _ENDS,
    S.LOST: _PLANNED | _ENDS,
    S.RESTARTING: frozenset({S.OPENING, S.STOPPING}),
    S.REFUSED: frozenset({S.OPENING, S.STOPPING}),
    S.FENCED: frozenset({S.OPENING, S.STOPPING}),
    S.STOPPING: frozenset({S.STOPPED}),
    S.STOPPED: frozenset(),
}
"""Every allowed move (staying in a state is always allowed and is no move)."""


class IllegalTransition(AssertionError):
    """A move the table does not allow: a bug in the worker."""


class ReplayStates:
    """The current state of one worker; ``enter`` is the only way to change it.

    Args:
        where: names the partition in log lines.
        on_enter: called with (old, new) after every move (the worker sets its gauges).
    """

    def __init__(self, where: str,
                 on_enter: Callable[[ReplayState, ReplayState], None] | None = None) -> None:
        self.where = where
        self.state = S.NEW
        self._on_enter = on_enter

    def enter(self, new: ReplayState, why: str = "") -> bool:
        """Move to ``new``; True if that is a move (False: already there).

        Raises:
            IllegalTransition: the table does not allow it.
        """
        old = self.state
        if new is old:
            return False
        if new not in TRANSITIONS[old]:
            raise IllegalTransition(f"{self.where}: {old.name} -> {new.name} is not a "
                                    f"move of the replay worker ({why})")
        self.state = new
        log.debug("%s: %s -> %s%s", self.where, old.name, new.name,
                  f" ({why})" if why else "")
        if self._on_enter is not None:
            self._on_enter(old, new)
        return True

    @property
    def in_session(self) -> bool:
        """True while the worker has a session."""
        return self.state in IN_SESSION
