"""Bodies of the spawned processes in test_multiprocess.py (importable by the child)."""

from __future__ import annotations

import hashlib
import json

from ._backends import open_cache


def make_value(writer: int, seq: int) -> bytes:
    """A self-checking value: header, then a digest-derived body of varying length."""
    head = f"W{writer:02d}-{seq:05d}|".encode()
    seed = hashlib.sha256(head).digest()
    body = (seed * ((writer * 97 + seq * 13) % 300 + 20))[: 600 + (seq * 37) % 4000]
    return head + body


def is_valid(value: bytes) -> bool:
    try:
        writer, seq = int(value[1:3]), int(value[4:9])
    except ValueError:
        return False
    return value == make_value(writer, seq)


def write_one_key(kind: str, base: str, key: bytes, writer: int, n: int) -> None:
    with open_cache(kind, base) as c:
        for seq in range(n):
            c[key] = make_value(writer, seq)


def write_distinct(kind: str, base: str, writer: int, n: int) -> None:
    with open_cache(kind, base) as c:
        for seq in range(n):
            c[f"w{writer}-k{seq}"] = make_value(writer, seq)


def read_until(kind: str, base: str, key: bytes, stop, out: str) -> None:  # type: ignore[no-untyped-def]
    hits = misses = bad = 0
    with open_cache(kind, base) as c:
        while not stop.is_set() or hits + misses < 50:
            got = c.get(key)
            if got is None:
                misses += 1
            elif is_valid(got):
                hits += 1
            else:
                bad += 1
        corrupt = c.stats().corrupt
    with open(out, "w") as f:
        json.dump({"hits": hits, "misses": misses, "bad": bad, "corrupt": corrupt}, f)


def churn(kind: str, base: str, cap: int, writer: int, n: int) -> None:
    with open_cache(kind, base, max_size_bytes=cap) as c:
        for seq in range(n):
            c[f"churn{writer}-{seq}"] = make_value(writer, seq)


def rewrite_and_check(kind: str, base: str, cap: int, key: bytes, n: int, out: str) -> None:
    lost = wrong = 0
    with open_cache(kind, base, max_size_bytes=cap) as c:
        for seq in range(n):
            value = make_value(99, seq)
            c[key] = value
            got = c.get(key)
            if got is None:
                lost += 1
            elif got != value and not is_valid(got):
                wrong += 1
    with open(out, "w") as f:
        json.dump({"lost": lost, "wrong": wrong}, f)


def evict_with_pause(base: str, reached, go, out: str) -> None:  # type: ignore[no-untyped-def]
    """Store ``new`` into a full cache, pausing the eviction pass after its scan,
    right before its first removal (before it takes the counter's lock, which
    a deleter needs too), until the other process has acted."""
    from nexus_cache.program.filestream import _scan
    from nexus_cache.program.filestream._usage import UsageCounter

    real = _scan.unlink_if_unchanged
    real_hold = UsageCounter.hold
    state = {"holds": 0, "outcomes": []}

    def pausing_hold(self):  # type: ignore[no-untyped-def]
        # Holds: the store's, the rescan's, then the first removal's.
        state["holds"] += 1
        if state["holds"] == 3:
            reached.set()
            assert go.wait(30)
        return real_hold(self)

    def recording(path, expected, **kw):  # type: ignore[no-untyped-def]
        outcome = real(path, expected, **kw)
        state["outcomes"].append(outcome.value)
        return outcome

    _scan.unlink_if_unchanged = recording  # type: ignore[assignment]
    UsageCounter.hold = pausing_hold  # type: ignore[method-assign]
    with open_cache("filestream", base, max_size_bytes=1000) as c:
        c[b"new"] = b"n" * 400
        s = c.stats()
    with open(out, "w") as f:
        json.dump({"outcomes": state["outcomes"], "evictions": s.evictions}, f)


def act_when_told(base: str, action: str, key: bytes, reached, go) -> None:  # type: ignore[no-untyped-def]
    assert reached.wait(30)
    with open_cache("filestream", base) as c:
        if action == "delete":
            del c[key]
        else:
            c[key] = b"v2" * 200
    go.set()


def rewrite_and_delete(base: str, cap: int, writer: int, n: int) -> None:
    """Rewrite and delete a handful of shared keys at random (the counter's worst case)."""
    import random

    rng = random.Random(writer)
    with open_cache("filestream", base, max_size_bytes=cap) as c:
        for seq in range(n):
            key = f"shared{rng.randrange(4)}"
            if rng.random() < 0.25:
                try:
                    del c[key]
                except KeyError:
                    pass
            else:
                c[key] = make_value(writer, seq)


def open_at_once(base: str, go, writer: int) -> None:  # type: ignore[no-untyped-def]
    """Open a (fresh) SQLite cache the moment ``go`` is set, and store one key."""
    assert go.wait(30)
    with open_cache("sqlite", base) as c:
        c[f"opener{writer}"] = make_value(writer, 0)
