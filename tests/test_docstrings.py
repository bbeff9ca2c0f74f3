"""The public names' docstrings (``docs/architecture.md``, "Docstrings and examples").

Every function and class exported by ``nexus_cache.graph``,
``nexus_cache.lakehouse``, ``nexus_cache.client`` and ``nexus_cache.service``
carries a NumPy-style docstring: a ``Parameters`` section where it takes
arguments, a ``Returns`` section where a function returns a value, and an
``Examples`` section with at least one ``>>>`` line. The examples run here as
doctests, on the host backend and without a server, so they stay true.
"""

from __future__ import annotations

import doctest
import importlib
import inspect
import io
import itertools
from collections.abc import Callable, Iterator

import pytest

PACKAGES = (
    "nexus_cache.graph",
    "nexus_cache.lakehouse",
    "nexus_cache.client",
    "nexus_cache.service",
)

# Classes whose public methods are documented as well (their own sections).
WITH_METHODS = {"nexus_cache.client.Client"}

# Names not yet documented this way; the list only shrinks.
NOT_DOCUMENTED_YET = {
    "nexus_cache.client.Client.execute",
    "nexus_cache.service.Count",
    "nexus_cache.service.DeviceSettings",
    "nexus_cache.service.GraphQuery",
    "nexus_cache.service.Scan",
    "nexus_cache.service.ServiceConfig",
    "nexus_cache.service.graph_params",
    "nexus_cache.service.load_lakehouse_config",
    "nexus_cache.service.load_lakehouse_root",
}

_FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _documented() -> Iterator[tuple[str, Callable[..., object]]]:
    for package in PACKAGES:
        module = importlib.import_module(package)
        for name in module.__all__:
            obj = getattr(module, name)
            if not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue  # data: documented where the module describes it
            yield f"{package}.{name}", obj
            if f"{package}.{name}" in WITH_METHODS:
                for attr, value in vars(obj).items():
                    if not attr.startswith("_") and inspect.isfunction(value):
                        yield f"{package}.{name}.{attr}", value


def _sections(doc: str) -> set[str]:
    lines = doc.splitlines()
    return {
        line.strip()
        for line, below in itertools.pairwise(lines)
        if below.strip() and set(below.strip()) == {"-"} and len(below.strip()) >= 3
    }


def _parameters(obj: Callable[..., object]) -> list[str]:
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return []
    return [p for p in signature.parameters if p not in ("self", "cls")]


def docstring_gaps(name: str, obj: Callable[..., object]) -> list[str]:
    """What the NumPy-style docstring of ``obj`` lacks."""
    doc = inspect.getdoc(obj) or ""
    sections = _sections(doc)
    gaps = []
    is_enum = inspect.isclass(obj) and any(b.__name__ == "Enum" for b in obj.__mro__)
    if _parameters(obj) and not is_enum and "Parameters" not in sections:
        gaps.append(f"{name}: no Parameters section")
    if inspect.isfunction(obj):
        returns = inspect.signature(obj).return_annotation
        if returns not in ("None", None, inspect.Signature.empty) and "Returns" not in sections:
            gaps.append(f"{name}: no Returns section")
    if "Examples" not in sections or ">>>" not in doc:
        gaps.append(f"{name}: no Examples section with a >>> line")
    return gaps


DOCUMENTED = dict(_documented())


@pytest.mark.parametrize("name", sorted(set(DOCUMENTED) - NOT_DOCUMENTED_YET))
def test_a_public_name_has_a_numpy_style_docstring_with_an_example(name: str) -> None:
    assert docstring_gaps(name, DOCUMENTED[name]) == []


def test_the_allowlist_names_only_what_still_needs_it() -> None:
    assert set(DOCUMENTED) >= NOT_DOCUMENTED_YET
    assert [n for n in sorted(NOT_DOCUMENTED_YET) if not docstring_gaps(n, DOCUMENTED[n])] == []


def test_the_docstring_check_catches_a_missing_section() -> None:
    def plain(x: int) -> int:
        """Twice ``x``."""
        return 2 * x

    def numpy_style(x: int) -> int:
        """Twice ``x``.

        Parameters
        ----------
        x : int
            A number.

        Returns
        -------
        int

        Examples
        --------
        >>> numpy_style(2)
        4
        """
        return 2 * x

    assert docstring_gaps("plain", plain) == [
        "plain: no Parameters section",
        "plain: no Returns section",
        "plain: no Examples section with a >>> line",
    ]
    assert docstring_gaps("numpy_style", numpy_style) == []


# The modules that define the public names: their examples run as doctests.
MODULES = sorted(
    {obj.__module__ for name, obj in DOCUMENTED.items() if name not in NOT_DOCUMENTED_YET}
)


def run_doctests(module_name: str) -> tuple[doctest.TestResults, str]:
    """Run every example in ``module_name``'s docstrings; the results and the report."""
    module = importlib.import_module(module_name)
    out = io.StringIO()
    runner = doctest.DocTestRunner(optionflags=_FLAGS)
    for test in doctest.DocTestFinder(exclude_empty=True).find(module, module_name):
        runner.run(test, out=out.write)
    return runner.summarize(verbose=False), out.getvalue()


@pytest.mark.parametrize("module", MODULES)
def test_the_examples_of_a_module_run(module: str) -> None:
    results, report = run_doctests(module)
    assert results.failed == 0, report
    assert results.attempted > 0, f"{module}: no example ran"


def test_the_doctest_run_catches_a_wrong_example(tmp_path, monkeypatch) -> None:
    (tmp_path / "wrong_example.py").write_text(
        'def f():\n    """\n    >>> 1 + 1\n    3\n    """\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    results, report = run_doctests("wrong_example")
    assert (results.failed, results.attempted) == (1, 1)
    assert "Expected:\n    3\nGot:\n    2" in report
