"""Server and client processes of ``benchmarks/serve.py``: ``nexus-cache serve``
on a free loopback port (its address read from its log), and client
processes that each run a snippet of Python."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading

__all__ = ["Server", "start_clients"]


class Server:
    def __init__(self, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "nexus_cache.cli.main", "serve", "--port", "0"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._ready = threading.Event()
        self.url = ""
        threading.Thread(target=self._pump, daemon=True).start()
        if not self._ready.wait(120):
            raise SystemExit("the server did not start:\n" + "\n".join(self.lines))

    def _pump(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            if len(self.lines) < 2000:  # the soak logs a line per query
                self.lines.append(line.rstrip())
            if not self._ready.is_set() and (m := re.search(r"listening on (\S+)", line)):
                self.url = m.group(1)
                self._ready.set()

    def rss_bytes(self) -> int:
        with open(f"/proc/{self.process.pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(120)


def start_clients(
    env: dict[str, str], code: str, argv: list[list[str]]
) -> list[subprocess.Popen[str]]:
    return [
        subprocess.Popen(
            [sys.executable, "-c", code, *a],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for a in argv
    ]
