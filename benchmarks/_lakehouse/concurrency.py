"""Figure (4): N spawned processes read one uncached object at once.

Counts how often the remote was fetched and whether any reader got wrong or
partial bytes, for ours (``fill_before_read``) and both peers. The processes are
spawned once and run every task in lockstep (a barrier before each).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _lakehouse.peers import PEERS, Remote, build_remote, make_ours, make_peer, peer_read
from _lakehouse.s3 import COUNTS, CTX, install_counters
from _lakehouse.workloads import Bench

__all__ = ["ConcResult", "bench_concurrency"]


def _conc_worker(index: int, spec_json: str, barrier: Any) -> None:
    """One of N processes: for each task, set up, meet the others, read everything."""
    spec = json.loads(spec_json)
    install_counters()
    out: list[dict[str, Any]] = []
    for task in spec["tasks"]:
        COUNTS.clear()
        rec: dict[str, Any] = {
            "remote": task["remote"],
            "kind": task["kind"],
            "round": task["round"],
            "error": None,
        }
        reader: Callable[[], tuple[bytes, Any]] | None = None
        try:
            remote = build_remote(
                task["remote"], spec["endpoint"], Path(spec["data"]), spec["s3_path"]
            )
            if task["kind"] == "ours":
                cache = make_ours(Path(task["dir"]), "fill_before_read", spec["size"])

                def reader(cache: Any = cache, remote: Remote = remote) -> tuple[bytes, Any]:
                    with cache.open(remote.path, fs=remote.fs) as f:
                        return f.read(), f.diagnostics.to_dict()
            else:
                pfs = make_peer(task["kind"], remote.fs, Path(task["dir"]))

                def reader(pfs: Any = pfs, remote: Remote = remote) -> tuple[bytes, Any]:
                    return peer_read(pfs, remote), None
        except Exception as exc:
            rec["error"] = f"setup: {type(exc).__name__}: {exc}"
        try:
            barrier.wait(timeout=300)
        except Exception as exc:  # another process failed: stop, say so
            rec["error"] = rec["error"] or f"barrier: {type(exc).__name__}"
            out.append(rec)
            break
        rec["start"], cpu = time.time(), time.process_time()
        if reader is not None and rec["error"] is None:
            try:
                data, diag = reader()
                rec["end"], rec["cpu_s"] = time.time(), time.process_time() - cpu
                rec["len"] = len(data)
                rec["sha_ok"] = hashlib.sha256(data).hexdigest() == spec["sha"]
                rec["diag"] = diag
                del data
            except Exception as exc:
                rec["error"] = f"{type(exc).__name__}: {exc}"[:300]
        rec.setdefault("end", time.time())
        if task["kind"] == "ours" and reader is not None and rec["error"] is None:
            counts = cache.events.counts()
            rec["fills"] = counts.get("fill_completed", 0)
            rec["remote_reads"] = (
                rec["fills"] + counts.get("fill_failed", 0) + counts.get("read_mode.remote", 0)
            )
        else:
            rec["remote_reads"] = COUNTS.get("local_get_file", 0)
        rec["s3_gets"] = COUNTS.get("get_object", 0)
        rec["s3_bytes"] = COUNTS.get("s3_bytes", 0)
        out.append(rec)
        try:
            barrier.wait(timeout=900)  # the next task starts when every reader is done
        except Exception:
            break
    Path(spec["out"], f"worker-{index}.json").write_text(json.dumps(out))


@dataclasses.dataclass
class ConcResult:
    remote: str
    kind: str
    readers: int
    correct: int
    partial: int
    wrong: int
    errors: list[str]
    fetched: float  # object sizes fetched from the remote per round, all readers together
    fills: list[int] | None  # per round
    wall_s: float  # median over rounds: first reader's start to last reader's end
    bad_lengths: list[int]  # lengths read by readers that got wrong or partial bytes

    @classmethod
    def from_records(
        cls, remote: str, kind: str, recs: list[dict[str, Any]], procs: int, rounds: int, size: int
    ) -> ConcResult:
        by_round = [[r for r in recs if r["round"] == n] for n in range(rounds)]
        walls = [
            max(r["end"] for r in rs) - min(r["start"] for r in rs)
            for rs in by_round
            if rs and all("start" in r for r in rs)
        ]
        read = [r for r in recs if r["error"] is None]
        bad = [r for r in read if not (r["len"] == size and r["sha_ok"])]
        if remote == "s3":  # bytes of GET responses read, in object sizes
            fetched = sum(r["s3_bytes"] for r in recs) / size / rounds
        else:  # whole-object reads of the source file
            fetched = sum(r.get("remote_reads", 0) for r in recs) / rounds
        return cls(
            remote=remote,
            kind=kind,
            readers=procs * rounds,
            correct=len(read) - len(bad),
            partial=sum(1 for r in bad if r["len"] < size),
            wrong=sum(1 for r in bad if r["len"] >= size),
            errors=[r["error"] for r in recs if r["error"]]
            + ["no result"] * (procs * rounds - len(recs)),
            fetched=fetched,
            fills=[sum(r.get("fills", 0) for r in rs) for rs in by_round]
            if kind == "ours"
            else None,
            wall_s=statistics.median(walls) if walls else float("nan"),
            bad_lengths=sorted(r["len"] for r in bad),
        )

    @property
    def verdict(self) -> str:
        if self.kind != "ours":
            return "observed"
        rounds = len(self.fills or [])
        one_fill = self.fills is not None and set(self.fills) == {1}
        ok = one_fill and rounds and self.correct == self.readers and abs(self.fetched - 1) < 0.01
        return "met" if ok else "NOT met"


def bench_concurrency(
    b: Bench,
    remotes: list[Remote],
    endpoint: str | None,
    s3_path: str | None,
    procs: int,
    rounds: int,
) -> list[ConcResult]:
    """Figure (4): ``procs`` processes, spawned once, run every task in lockstep."""
    base = b.fresh_dir("concurrency")
    tasks = []
    for n in range(rounds):
        for remote in remotes:
            for kind in ("ours", *PEERS):
                d = base / f"{remote.name}-{kind}-{n}"
                d.mkdir()
                tasks.append({"remote": remote.name, "kind": kind, "dir": str(d), "round": n})
    spec = {
        "tasks": tasks,
        "endpoint": endpoint,
        "s3_path": s3_path,
        "data": str(b.data),
        "size": b.size,
        "sha": b.sha,
        "out": str(base),
    }
    barrier = CTX.Barrier(procs)
    workers = [
        CTX.Process(target=_conc_worker, args=(i, json.dumps(spec), barrier)) for i in range(procs)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join(1800)
        if w.is_alive():
            w.terminate()
            w.join(15)
    records: list[dict[str, Any]] = []
    for i in range(procs):
        path = base / f"worker-{i}.json"
        if path.exists():
            records.extend(json.loads(path.read_text()))
    results = []
    for remote in remotes:
        for kind in ("ours", *PEERS):
            recs = [r for r in records if (r["remote"], r["kind"]) == (remote.name, kind)]
            results.append(ConcResult.from_records(remote.name, kind, recs, procs, rounds, b.size))
    for res in results:
        fills = f", fills per round {res.fills}" if res.fills is not None else ""
        errors = f", errors: {sorted(set(res.errors))}" if res.errors else ""
        if res.bad_lengths:
            errors += f" (bad readers got {res.bad_lengths} of {b.size} bytes)"
        print(
            f"RESULT (4) [{res.remote}] {res.kind}: {res.readers} reads, remote fetched "
            f"{res.fetched:.2f}x the object per round{fills}; {res.correct} correct, "
            f"{res.partial} partial, {res.wrong} wrong bytes{errors}; "
            f"wall {res.wall_s * 1e3:.0f} ms per round -> {res.verdict}"
        )
    for remote in remotes:
        ours = next(r for r in results if (r.remote, r.kind) == (remote.name, "ours"))
        for peer in (r for r in results if r.remote == remote.name and r.kind != "ours"):
            print(
                f"RATIO (4) [{remote.name}] ours vs {peer.kind}: remote fetches {ours.fetched:.2f}x vs "
                f"{peer.fetched:.2f}x; correct readers {ours.correct}/{ours.readers} vs "
                f"{peer.correct}/{peer.readers}; wall time ours/peer = {ours.wall_s / peer.wall_s:.2f}"
            )
    return results
