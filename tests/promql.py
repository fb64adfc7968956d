"""A tiny PromQL evaluator for the alert rules the tests evaluate on scraped ``/metrics``.

It knows the subset the instant rules of deploy/prometheus use: selectors with ``{k="v"}``
matchers, numbers, ``time()``, ``absent(...)``, ``max``/``min``/``sum`` ``by (...)``,
``+ - * /``, the comparisons (as filters), and ``and``/``or``/``unless`` with an optional
``on (...)``. Rules over time (``increase(x[15m])``, ``changes``, ``rate``, ``x offset 1h``)
are evaluated over a ``History`` of scrapes (``evaluate_at``/``fires_at``); from one scrape
they are refused. ``metric_names`` lists the metrics any rule expression reads.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import pairwise

from prometheus_client.parser import text_string_to_metric_families

Labels = frozenset[tuple[str, str]]
Vector = dict[Labels, float]
Value = Vector | float

_TOKEN = re.compile(r'\s*(?:(?P<dur>\d+[smhdwy](?![a-zA-Z0-9_]))'
                    r'|(?P<num>\d+(?:\.\d+)?(?:e\d+)?)'
                    r'|(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)'
                    r'|(?P<str>"[^"]*")|(?P<op>>=|<=|==|!=|[-+*/><(){},=\[\]]))')
_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "bool", "offset"}
_FUNCTIONS = {"time", "absent", "max", "min", "sum", "count", "avg", "increase", "rate",
              "deriv", "changes", "delta", "vector", "scalar", "abs", "clamp_min",
              "max_over_time"}
_COMPARE: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt, "<": operator.lt, ">=": operator.ge, "<=": operator.le,
    "==": operator.eq, "!=": operator.ne}
_ARITH: dict[str, Callable[[float, float], float]] = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}
_AGG: dict[str, Callable[[Iterable[float]], float]] = {
    "max": max, "min": min, "sum": sum, "count": lambda xs: float(len(list(xs)))}
# Lowest first, as in PromQL.
_LEVELS = (("or",), ("and", "unless"), tuple(_COMPARE), ("+", "-"), ("*", "/"))


def _tokens(expr: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    expr = expr.strip()
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m is None or m.end() == pos:
            raise ValueError(f"cannot read {expr[pos:]!r}")
        kind = m.lastgroup
        assert kind is not None
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


def metric_names(expr: str) -> set[str]:
    """Names of the metrics an expression selects."""
    toks = _tokens(expr)
    names = set()
    for i, (kind, text) in enumerate(toks):
        if kind != "name" or text in _KEYWORDS or text in _FUNCTIONS:
            continue
        before = toks[i - 1][1] if i else ""
        after = toks[i + 1][1] if i + 1 < len(toks) else ""
        if before in ("{", ",") and after in ("=", "!="):
            continue      # a label matcher
        if before == "(" and i >= 2 and toks[i - 2][1] in ("by", "on", "without", "ignoring"):
            continue      # a label list
        if before == "," and after in (",", ")") and _in_label_list(toks, i):
            continue
        names.add(text)
    return names


def _in_label_list(toks: list[tuple[str, str]], i: int) -> bool:
    j = i
    while j > 0 and toks[j][1] != "(":
        j -= 1
    return j >= 1 and toks[j - 1][1] in ("by", "on", "without", "ignoring")


def scrape(text: str) -> dict[str, Vector]:
    """Samples of a ``/metrics`` text by name."""
    out: dict[str, Vector] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[frozenset(s.labels.items())] = s.value
    return out


Scrape = dict[str, Vector]
History = list[tuple[float, Scrape]]
"""Scrapes with their times (seconds since the epoch), oldest first."""

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
_RANGE_FUNCTIONS = {"increase", "changes", "rate", "max_over_time"}


def _seconds(duration: str) -> float:
    return float(duration[:-1]) * _UNITS[duration[-1]]


def _at(history: History, t: float) -> Scrape:
    """The newest scrape at or before ``t`` (Prometheus' 5-minute staleness ignored)."""
    out: Scrape = {}
    for when, scrape_ in history:
        if when <= t:
            out = scrape_
    return out


def _increase(points: list[float]) -> float:
    """Increase of a counter over its points, counter resets counted as from zero."""
    total = 0.0
    for a, b in pairwise(points):
        total += b - a if b >= a else b
    return total


@dataclass
class _Parser:
    toks: list[tuple[str, str]]
    samples: dict[str, Vector]
    now: float
    history: History | None = None
    pos: int = 0

    def peek(self) -> str:
        return self.toks[self.pos][1] if self.pos < len(self.toks) else ""

    def take(self, want: str | None = None) -> str:
        text = self.peek()
        if want is not None and text != want:
            raise ValueError(f"expected {want!r}, got {text!r}")
        self.pos += 1
        return text

    def labels(self) -> tuple[str, ...]:
        self.take("(")
        out = []
        while self.peek() != ")":
            out.append(self.take())
            if self.peek() == ",":
                self.take()
        self.take(")")
        return tuple(out)

    def expr(self, level: int = 0) -> Value:
        if level == len(_LEVELS):
            return self.unary()
        left = self.expr(level + 1)
        while self.peek() in _LEVELS[level]:
            op = self.take()
            on = self.labels() if self.peek() == "on" and self.take() else None
            right = self.expr(level + 1)
            left = _binary(op, left, right, on)
        return left

    def unary(self) -> Value:
        kind, text = self.toks[self.pos]
        if kind == "num":
            self.take()
            return float(text)
        self.take()
        if text == "(":
            v = self.expr()
            self.take(")")
            return v
        if text == "time":
            self.take("(")
            self.take(")")
            return self.now
        if text == "absent":
            v = self.call()
            return {} if v else {frozenset(): 1.0}
        if text in _AGG:
            return self.aggregate(text)
        if text in _RANGE_FUNCTIONS and self.history is not None:
            return self.over_range(text)
        if text in _FUNCTIONS:
            raise ValueError(f"{text}() is not evaluated from one scrape")
        return self.selector(text)

    def call(self) -> Vector:
        self.take("(")
        v = self.expr()
        self.take(")")
        assert isinstance(v, dict)
        return v

    def aggregate(self, fn: str) -> Vector:
        by = self.labels() if self.peek() == "by" and self.take() else ()
        groups: dict[Labels, list[float]] = {}
        for lab, x in self.call().items():
            groups.setdefault(frozenset((k, w) for k, w in lab if k in by), []).append(x)
        return {lab: _AGG[fn](xs) for lab, xs in groups.items()}

    def matchers(self) -> dict[str, str]:
        matchers: dict[str, str] = {}
        if self.peek() == "{":
            self.take()
            while self.peek() != "}":
                k = self.take()
                self.take("=")
                matchers[k] = self.take().strip('"')
                if self.peek() == ",":
                    self.take()
            self.take("}")
        return matchers

    def selector(self, name: str) -> Vector:
        matchers = self.matchers()
        if self.peek() == "[":
            raise ValueError(f"range vector of {name} is not evaluated from one scrape")
        samples = self.samples
        if self.peek() == "offset":
            self.take()
            if self.history is None:
                raise ValueError(f"{name} offset ... is not evaluated from one scrape")
            samples = _at(self.history, self.now - _seconds(self.take()))
        return _select(samples, name, matchers)

    def over_range(self, fn: str) -> Vector:
        """``increase``/``changes``/``rate``/``max_over_time`` of ``name{...}[range]``
        over the history."""
        assert self.history is not None
        self.take("(")
        name = self.take()
        matchers = self.matchers()
        self.take("[")
        window = _seconds(self.take())
        self.take("]")
        self.take(")")
        series: dict[Labels, list[float]] = {}
        for when, scrape_ in self.history:
            if self.now - window <= when <= self.now:
                for lab, x in _select(scrape_, name, matchers).items():
                    series.setdefault(lab, []).append(x)
        out: Vector = {}
        for lab, points in series.items():
            if fn == "max_over_time":
                out[lab] = max(points)
            elif fn == "changes":
                out[lab] = float(sum(a != b for a, b in pairwise(points)))
            elif len(points) >= 2:
                inc = _increase(points)
                out[lab] = inc / window if fn == "rate" else inc
        return out


def _select(samples: Scrape, name: str, matchers: dict[str, str]) -> Vector:
    return {lab: x for lab, x in samples.get(name, {}).items()
            if all((k, w) in lab for k, w in matchers.items())}


def _key(lab: Labels, on: tuple[str, ...] | None) -> Labels:
    return lab if on is None else frozenset((k, v) for k, v in lab if k in on)


def _binary(op: str, left: Value, right: Value, on: tuple[str, ...] | None) -> Value:
    if op in ("and", "or", "unless"):
        assert isinstance(left, dict) and isinstance(right, dict)
        rkeys = {_key(lab, on) for lab in right}
        if op == "and":
            return {lab: x for lab, x in left.items() if _key(lab, on) in rkeys}
        if op == "unless":
            return {lab: x for lab, x in left.items() if _key(lab, on) not in rkeys}
        lkeys = {_key(lab, on) for lab in left}
        return left | {lab: x for lab, x in right.items() if _key(lab, on) not in lkeys}
    fn: Callable[[float, float], float | bool] = _COMPARE.get(op) or _ARITH[op]
    if isinstance(left, float) and isinstance(right, float):
        return float(fn(left, right))
    if isinstance(right, float):
        assert isinstance(left, dict)
        pairs = {lab: (x, right) for lab, x in left.items()}
    elif isinstance(left, float):
        pairs = {lab: (left, x) for lab, x in right.items()}
    else:
        rmap = {_key(lab, on): x for lab, x in right.items()}
        pairs = {lab: (x, rmap[_key(lab, on)]) for lab, x in left.items()
                 if _key(lab, on) in rmap}
    if op in _COMPARE:
        # A filter: the vector side's value is kept.
        keep = left if isinstance(left, dict) else right
        assert isinstance(keep, dict)
        return {lab: keep[lab] for lab, (a, b) in pairs.items() if fn(a, b)}
    return {lab: float(fn(a, b)) for lab, (a, b) in pairs.items()}


def _run(p: _Parser, expr: str) -> Value:
    v = p.expr()
    if p.pos != len(p.toks):
        raise ValueError(f"unread rest of {expr!r}: {p.toks[p.pos:]}")
    return v


def evaluate(expr: str, samples: dict[str, Vector], now: float) -> Value:
    """The value of ``expr`` over one scrape's samples at ``now`` (seconds since the epoch)."""
    return _run(_Parser(_tokens(expr), samples, now), expr)


def fires(expr: str, samples: dict[str, Vector], now: float) -> bool:
    """True when ``expr`` gives a non-empty vector (an alert's condition holds)."""
    v = evaluate(expr, samples, now)
    return bool(v)


def evaluate_at(expr: str, history: History, now: float) -> Value:
    """The value of ``expr`` at ``now`` over scrapes taken until then (oldest first)."""
    return _run(_Parser(_tokens(expr), _at(history, now), now, history), expr)


def fires_at(expr: str, history: History, now: float) -> bool:
    """True when ``expr`` over ``history`` gives a non-empty vector at ``now``."""
    return bool(evaluate_at(expr, history, now))
