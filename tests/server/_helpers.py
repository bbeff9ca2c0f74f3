"""Real ``nexus-cache serve`` processes on loopback, for the server tests."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PYTHONPATH = os.pathsep.join(p for p in sys.path if p)


def server_env(root: Path, backend: str = "host", **extra: str) -> dict[str, str]:
    """The environment of a server (and its CLI clients) with its caches under ``root``."""
    env = {
        **os.environ,
        "PYTHONPATH": PYTHONPATH,
        "NEXUS_DEVICE_BACKEND": backend,
        "NEXUS_LAKEHOUSE_CACHE_ROOT": str(root / "cache"),
        "NEXUS_LAKEHOUSE_CACHE_POLICY": "fill_before_read",
        "NEXUS_LAKEHOUSE_CACHE_MAX_BYTES": "4GiB",
        "NEXUS_HOST_DEVICE_TOTAL_BYTES": str(2 << 30),
    }
    for name in ("NEXUS_SERVER_TOKEN", "NEXUS_SERVER_URL", "NEXUS_SERVICE_CONFIG"):
        env.pop(name, None)
    env.update(extra)
    return env


@dataclass
class Server:
    """A running server process; ``url`` and ``metrics_url`` come from its log."""

    process: subprocess.Popen[str]
    url: str = ""
    metrics_url: str | None = None
    lines: list[str] = field(default_factory=list)

    def log(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float = 30.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        exited = False
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if match := re.search(pattern, line):
                    return match
            if exited:
                break
            exited = self.process.poll() is not None  # one more look at what it wrote
            time.sleep(0.2 if exited else 0.05)
        raise AssertionError(f"no {pattern!r} in the server log:\n{self.log()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        code = self.process.wait(timeout)
        return code


def start_server(env: dict[str, str], *args: str, timeout: float = 60.0) -> Server:
    """Start ``nexus-cache serve --port 0 ARGS`` and wait until it logs its URL."""
    process = subprocess.Popen(
        [sys.executable, "-m", "nexus_cache.cli.main", "serve", "--port", "0", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    server = Server(process)

    def pump() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            server.lines.append(line.rstrip("\n"))
        process.stderr.close()

    threading.Thread(target=pump, daemon=True).start()
    match = server.wait_for(r"listening on (grpc(?:\+tls)?://\S+)", timeout)
    server.url = match.group(1)
    if "--metrics-port" in args:
        server.metrics_url = server.wait_for(r"metrics at (http://\S+)").group(1)
    return server


def run_cli(
    env: dict[str, str], *args: str, timeout: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """``nexus-cache ARGS`` in a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "nexus_cache.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def run_python(env: dict[str, str], code: str, *argv: str) -> subprocess.Popen[str]:
    """A Python process running ``code`` with ``argv``; stdout piped."""
    return subprocess.Popen(
        [sys.executable, "-c", code, *argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_until(predicate: Any, timeout: float = 20.0, step: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return bool(predicate())


def close_all(servers: Sequence[Server]) -> None:
    for server in servers:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait(30)


def admission_decisions(evidence: Path) -> list[str]:
    """The ``decision`` column of the admission log under ``evidence`` (none yet: [])."""
    path = evidence / "admission.tsv"
    if not path.exists():
        return []
    header, *rows = path.read_text().splitlines()
    column = header.split("\t").index("decision")
    return [row.split("\t")[column] for row in rows]


def end_processes(processes: Sequence[subprocess.Popen[str] | None]) -> None:
    """Kill those still running and collect every one."""
    for process in processes:
        if process is not None:
            if process.poll() is None:
                process.kill()
            process.communicate(timeout=30)
