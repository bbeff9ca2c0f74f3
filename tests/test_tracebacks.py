"""``drop_frame_locals``: a kept error keeps no local of the frames it passed through."""

from __future__ import annotations

import traceback
import weakref
from collections.abc import Iterator

import pytest

from nexus_cache._tracebacks import drop_frame_locals


class _Payload:
    """Stands for a cache entry's array: only a weak reference is kept by the test."""


def _fail_holding(payload: _Payload) -> None:
    held = [payload]
    raise ValueError(f"failed holding {len(held)} payload")


def _caught(payload: _Payload) -> BaseException:
    try:
        _fail_holding(payload)
    except ValueError as exc:
        return exc
    raise AssertionError("unreachable")


def test_a_kept_error_no_longer_holds_the_raising_frames_locals() -> None:
    payload = _Payload()
    alive = weakref.ref(payload)
    error = _caught(payload)
    del payload
    assert alive() is not None  # the traceback's frames hold it
    drop_frame_locals(error)
    assert alive() is None
    # what the traceback says stays: every function, file and line
    names = [frame.name for frame in traceback.extract_tb(error.__traceback__)]
    assert names == ["_caught", "_fail_holding"]
    assert "failed holding 1 payload" in "".join(traceback.format_exception(error))


def test_chained_errors_are_cleared_too() -> None:
    payload, context = _Payload(), _Payload()
    alive = [weakref.ref(payload), weakref.ref(context)]

    def chained(p: _Payload, c: _Payload) -> BaseException:
        try:
            try:
                _fail_holding(c)
            except ValueError:
                try:
                    _fail_holding(p)
                except ValueError as inner:
                    raise RuntimeError("wrapped") from inner
        except RuntimeError as exc:
            return exc
        raise AssertionError("unreachable")

    error = chained(payload, context)
    del payload, context
    assert all(ref() is not None for ref in alive)
    drop_frame_locals(error)
    assert [ref() for ref in alive] == [None, None]


def test_the_running_frame_keeps_its_own_locals() -> None:
    payload = _Payload()
    try:
        _fail_holding(payload)
    except ValueError as exc:
        drop_frame_locals(exc)  # this frame runs: it is left as it is
        assert isinstance(payload, _Payload)


def test_a_suspended_generator_in_the_traceback_runs_on() -> None:
    def steps() -> Iterator[object]:
        try:
            raise KeyError("caught inside")
        except KeyError as exc:
            yield exc  # suspended here, its frame in the error's traceback
        yield "resumed"

    generator = steps()
    error = next(generator)
    assert isinstance(error, BaseException)
    drop_frame_locals(error)
    assert next(generator) == "resumed"


def test_an_error_that_chains_itself_ends() -> None:
    error = _caught(_Payload())
    other = ValueError("other")
    error.__context__, other.__context__ = other, error
    drop_frame_locals(error)  # returns: each error is visited once
    with pytest.raises(ValueError, match="failed holding"):
        raise error
