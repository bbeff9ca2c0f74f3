"""Temp-file names that say which process on which host made them.

A name is ``<prefix><host>-<pid>-<random>.tmp``. ``<host>`` is a short digest
of the hostname, boot id and pid namespace, so a sweeper only trusts the pid
for temps made under the same kernel and pid namespace; anything else is judged
by age alone.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket

__all__ = ["host_tag", "parse_temp_name", "temp_name"]

_TEMP_RE = re.compile(r"([0-9a-f]{8})-([0-9]+)-[0-9a-f]+\.tmp\Z")
_host_tag: str | None = None


def _read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().decode("ascii", "replace").strip()
    except OSError:
        return ""


def host_tag() -> str:
    """Eight hex digits naming this host, boot and pid namespace."""
    global _host_tag
    if _host_tag is None:
        try:
            pidns = str(os.stat("/proc/self/ns/pid").st_ino)
        except OSError:
            pidns = ""
        ident = "\0".join((socket.gethostname(), _read("/proc/sys/kernel/random/boot_id"), pidns))
        _host_tag = hashlib.sha256(ident.encode()).hexdigest()[:8]
    return _host_tag


def temp_name(prefix: str = "") -> str:
    """A fresh, unique temp file name for the calling process."""
    return f"{prefix}{host_tag()}-{os.getpid()}-{os.urandom(8).hex()}.tmp"


def parse_temp_name(name: str) -> tuple[str, int] | None:
    """``(host_tag, pid)`` of a name made by :func:`temp_name`, else ``None``."""
    m = _TEMP_RE.search(name)
    if m is None:
        return None
    return m.group(1), int(m.group(2))
