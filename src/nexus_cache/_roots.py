"""``allowed_roots``: the only directories and URL prefixes a query may read.

One rule for every front end (the server's ticket check, and the service's
check of every object a source expands to), on the one normal form of a
location (:func:`split_location`; cluster routing keys on it too, through
:func:`location_key`): a local location is compared after resolving symlinks
and ``..`` (``file://`` and ``local://`` are local paths), a URL by prefix at
a ``/`` boundary, its scheme case-insensitive; a URL with a ``.`` or ``..``
segment is never allowed (a store may resolve it), percent-encoded ones
(``%2e%2e``, ``..%2f``) included: an HTTP client decodes and resolves them.
Pure functions; thread-safe.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import unquote

from nexus_cache.errors import ConfigError

__all__ = ["check_listed", "location_allowed", "location_key", "parse_roots", "split_location"]

#: fsspec protocols of the local filesystem
_LOCAL_SCHEMES = ("file", "local")


def parse_roots(value: Any, name: str) -> tuple[str, ...]:
    """``value`` (a list of directories or URL prefixes) as a tuple; ConfigError names ``name``."""
    if (
        isinstance(value, (str, bytes))
        or not isinstance(value, Iterable)
        or not all(isinstance(r, str) and r.strip() and "\x00" not in r for r in value)
    ):
        raise ConfigError(
            f"{name}={value!r} is not accepted; use a list of directories or URL prefixes"
        )
    return tuple(value)


def split_location(location: str) -> tuple[str, str] | None:
    """``(scheme, path)`` of ``location`` as written, without touching the filesystem.

    The one normal form of a location: blanks around it dropped, ``file://``
    and ``local://`` (any case) are the local scheme ``file``, a URL's scheme in
    lower case, trailing slashes dropped. None for a URL with a ``.`` or ``..``
    segment (a store may resolve it), also once percent-decoded.
    """
    text = location.strip()
    scheme, sep, rest = text.partition("://")
    if sep and "::" not in scheme and scheme.lower() in _LOCAL_SCHEMES:
        return "file", rest.rstrip("/") or rest
    if sep or "::" in text:
        if not sep:  # a chained URL without '://': its whole text is its scheme
            return text.lower(), ""
        if _dot_segment(rest):
            return None
        return scheme.lower(), rest.rstrip("/")
    return "file", text.rstrip("/") or text


def _dot_segment(path: str) -> bool:
    """Whether ``path`` (a URL's part after ``://``) has a ``.`` or ``..`` segment as
    written or once percent-decoded, however many times encoded: an HTTP client
    (aiohttp, as fsspec's ``http`` uses it) decodes ``%2e%2e`` and resolves it."""
    for _ in range(8):
        parts = path.split("/")
        if "." in parts or ".." in parts:
            return True
        decoded = unquote(path)
        if decoded == path:
            return False
        path = decoded
    return True  # encoded deeper than any client decodes: refused rather than guessed


def location_key(location: str) -> str:
    """One string per location, from :func:`split_location` (no filesystem access):
    a local path as its path, a URL as ``scheme://path``; ``location`` stripped when
    it has no normal form."""
    found = split_location(location)
    if found is None:
        return location.strip()
    scheme, path = found
    if scheme == "file":
        return path
    return f"{scheme}://{path}" if path else scheme


def _normal(location: str) -> tuple[str, str] | None:
    """``(scheme, path)`` of :func:`split_location`, a local path then resolved
    (symlinks, ``..``); None for a location no path can be made of (a NUL byte, an
    unencodable name)."""
    found = split_location(location)
    if found is None or found[0] != "file":
        return found
    try:
        return "file", os.path.realpath(os.path.expanduser(found[1]))
    except ValueError:  # an embedded NUL, a lone surrogate
        return None


def location_allowed(location: str, roots: Sequence[str]) -> bool:
    """True when ``location`` is one of ``roots`` or lies under one.

    Local paths compare after resolving symlinks and ``..``, so a link inside
    a root that points outside it is refused; URLs compare by prefix at a
    ``/`` boundary (``s3://bucket/data`` allows ``s3://bucket/data/x``, not
    ``s3://bucket/database``).
    """
    found = _normal(location)
    if found is None:
        return False
    scheme, path = found
    for root in roots:
        normal = _normal(root)
        if normal is None or normal[0] != scheme:
            continue
        root_path = normal[1]
        if path == root_path or path.startswith(root_path.rstrip("/") + "/"):
            return True
    return False


def check_listed(source: str, objects: Sequence[str], roots: Sequence[str]) -> None:
    """Refuse ``source`` unless it and every object it expands to (local paths, or
    URLs) lie under ``roots``: :class:`ConfigError` naming the first one outside.

    A directory's listing is checked whole, so that a link inside a root that
    points outside it (to a file or, named directly, to a directory) refuses
    the query rather than serving, or silently skipping, what it points to.
    """
    shown = ", ".join(roots)
    if not location_allowed(source, roots):
        raise ConfigError(
            f"source {source!r} is outside allowed_roots ({shown}); name a source under "
            "one of them"
        )
    for name in objects:
        if not location_allowed(name, roots):
            found = _normal(name)
            local = found is not None and found[0] == "file" and found[1] != name
            where = f", which resolves to {found[1]!r}," if local and found else ""
            raise ConfigError(
                f"{name!r} (listed in source {source!r}){where} is outside allowed_roots "
                f"({shown}); the query is refused: remove the link or name a source whose "
                "objects all lie under a root"
            )
