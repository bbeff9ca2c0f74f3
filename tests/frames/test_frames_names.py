"""Names in ``frames``: each reading function in the module named for it, and
one name and type for the lakehouse cache a function reads through."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import nexus_cache.frames as frames

PACKAGE = Path(frames.__file__).parent


def test_each_read_function_lives_in_the_module_named_for_it() -> None:
    assert frames.decode_parquet.__module__ == "nexus_cache.frames.decode"
    assert frames.read_parquet.__module__ == "nexus_cache.frames.read"
    assert frames.read_cached_parquet.__module__ == "nexus_cache.frames.source"
    assert frames.read_to_device.__module__ == "nexus_cache.frames.to_device"
    assert frames.kvikio_available.__module__ == "nexus_cache.frames.to_device"


def _lakehouse_parameters(path: Path) -> list[tuple[str, str, str]]:
    """``(function, parameter, annotation)`` of every parameter that names or
    is typed as a lakehouse cache."""
    found = []
    for node in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = node.args
            for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                note = "" if arg.annotation is None else ast.unparse(arg.annotation)
                if arg.arg in ("lake", "cache", "lakehouse") or "LakehouseCache" in note:
                    found.append((node.name, arg.arg, note))
    return found


def test_the_lakehouse_cache_is_lake_typed_lakehouse_cache_everywhere() -> None:
    found = [f for path in sorted(PACKAGE.rglob("*.py")) for f in _lakehouse_parameters(path)]
    assert sorted(found) == [
        ("read_cached_parquet", "lake", "LakehouseCache | None"),
        ("read_parquet", "lake", "LakehouseCache | None"),
    ]
    for function in (frames.read_parquet, frames.read_cached_parquet):
        parameter = inspect.signature(function).parameters["lake"]
        assert parameter.default is None
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY
