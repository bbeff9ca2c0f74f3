"""The one byte-size grammar and formatter shared by every layer and the CLI."""

from __future__ import annotations

import pytest

from nexus_cache._sizes import format_size, parse_size
from nexus_cache.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1048576", 1 << 20),
        (" 7 ", 7),
        ("1B", 1),
        ("64M", 64 << 20),
        ("64m", 64 << 20),
        ("10G", 10 << 30),
        ("1GiB", 1 << 30),
        ("3 KiB", 3 << 10),
        ("2KB", 2000),
        ("1MB", 10**6),
        ("1TB", 10**12),
        ("1TiB", 1 << 40),
        (12345, 12345),
    ],
)
def test_grammar(text, expected):
    assert parse_size(text, name="X") == expected


@pytest.mark.parametrize(
    "bad", ["", "-5", "1.5G", "١٢٣", "12Mi", "12iB", "ten", "1 2", True, 1.0, None]
)
def test_refused_names_the_setting(bad):
    with pytest.raises(ConfigError, match="MY_SETTING"):
        parse_size(bad, name="MY_SETTING")


def test_zero_only_where_it_means_something():
    with pytest.raises(ConfigError, match="positive"):
        parse_size("0", name="X")
    assert parse_size("0", name="X", allow_zero=True) == 0
    with pytest.raises(ConfigError):
        parse_size(-1, name="X", allow_zero=True)


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1536, "1.5 KiB"),
        (64 << 20, "64.0 MiB"),
        (3 << 40, "3.0 TiB"),
    ],
)
def test_format(n, text):
    assert format_size(n) == text
