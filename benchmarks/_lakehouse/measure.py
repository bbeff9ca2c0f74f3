"""Interleaved timing and the ratio rows every figure is reported as."""

from __future__ import annotations

import dataclasses
import gc
import statistics
import time
from collections.abc import Callable
from typing import Any

from _lakehouse.data import MIB

__all__ = ["Op", "Row", "fmt", "measure", "spread"]


@dataclasses.dataclass
class Op:
    """One timed call (``run``), checked after timing, with untimed ``prepare``."""

    run: Callable[[], Any]
    check: Callable[[Any, bool], None]
    prepare: Callable[[], None] = lambda: None


def measure(ops: dict[str, Op], repeats: int, *, warmup: bool) -> dict[str, list[float]]:
    """Median-ready timings; the order of the ops rotates every repeat."""
    times: dict[str, list[float]] = {name: [] for name in ops}
    names = list(ops)
    if warmup:
        for name in names:
            ops[name].prepare()
            ops[name].check(ops[name].run(), True)
    for r in range(repeats):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            op = ops[name]
            op.prepare()
            gc.collect()
            start = time.perf_counter()
            out = op.run()
            times[name].append(time.perf_counter() - start)
            op.check(out, r == 0 and not warmup)
            del out
    return times


@dataclasses.dataclass
class Row:
    """One ratio: ours against one peer, with its target and verdict.

    ``allowance_s`` widens a time target by a measured latency: met when
    ``ours <= target * peer + allowance_s`` (medians).
    """

    figure: str
    remote: str
    ours: str
    ours_s: list[float]
    peer: str
    peer_s: list[float]
    nbytes: int
    throughput: bool  # ratio reported as throughput ours/peer (else time ours/peer)
    target: float | None  # throughput: >= target; time: <= target
    allowance_s: float = 0.0

    @property
    def ratio(self) -> float:
        o, p = statistics.median(self.ours_s), statistics.median(self.peer_s)
        return p / o if self.throughput else o / p

    @property
    def limit(self) -> float | None:
        """The ratio the target allows (the allowance folded in)."""
        if self.target is None:
            return None
        return self.target + self.allowance_s / statistics.median(self.peer_s)

    @property
    def verdict(self) -> str:
        limit = self.limit
        if limit is None:
            return "reported"
        ok = self.ratio >= limit if self.throughput else self.ratio <= limit
        return "met" if ok else "NOT met"

    def line(self) -> str:
        o, p = statistics.median(self.ours_s), statistics.median(self.peer_s)
        kind = (
            "throughput ours/peer (higher is better)"
            if self.throughput
            else "time ours/peer (lower is better)"
        )
        target = ""
        if self.target is not None:
            sign = ">=" if self.throughput else "<="
            extra = ""
            if self.allowance_s:
                extra = f" + {self.allowance_s * 1e3:.1f} ms (one HEAD) = {self.limit:.2f}"
            target = f", target {sign} {self.target}{extra}: {self.verdict}"
        return (
            f"RATIO {self.figure} [{self.remote}] {self.ours} vs {self.peer}: "
            f"{fmt(o, self.nbytes)} vs {fmt(p, self.nbytes)} -> {kind} = {self.ratio:.2f}{target}"
        )


def fmt(seconds: float, nbytes: int) -> str:
    if seconds < 0.01:
        return f"{seconds * 1e3:.2f} ms ({nbytes / MIB / seconds:.0f} MiB/s)"
    return f"{seconds * 1e3:.0f} ms ({nbytes / MIB / seconds:.0f} MiB/s)"


def spread(times: list[float]) -> str:
    med = statistics.median(times)
    digits = 2 if med < 0.01 else 0
    return (
        f"median {med * 1e3:.{digits}f} ms, range {min(times) * 1e3:.{digits}f}-"
        f"{max(times) * 1e3:.{digits}f} ms, n={len(times)}"
    )
