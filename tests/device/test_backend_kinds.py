"""The backend registry (``backends/kinds.py``) and what backends and domains answer.

Everything outside ``backends/`` asks the registry, a backend or a domain
instead of spelling a backend name or testing for CuPy: these tests pin what
they answer, and that the CLI and the docs show the registry's names.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from nexus_cache.backends import HostBackend
from nexus_cache.backends.cupy_domain import CupyArrayDomain
from nexus_cache.backends.host import HostAllocationDomain
from nexus_cache.backends.kinds import (
    ALLOCATOR_NAMES,
    ALLOCATORS,
    AUTO,
    BACKEND_NAMES,
    BACKENDS,
    CUDA,
    HOST,
    backend_help,
    backend_kind,
)
from nexus_cache.errors import ConfigError, LifecycleError

ENV = "NEXUS_DEVICE_BACKEND"
DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_the_registry_names_every_backend_and_allocator_once() -> None:
    assert BACKENDS == (CUDA, HOST)
    assert BACKEND_NAMES == (AUTO, "cuda", "host")
    assert ALLOCATOR_NAMES == (AUTO, "rmm", "cupy")
    assert CUDA.allocators == ALLOCATORS
    assert HOST.allocators == ()
    assert (CUDA.host_memory, CUDA.cuda_kernels) == (False, True)
    assert (HOST.host_memory, HOST.cuda_kernels) == (True, False)
    assert backend_kind("host") is HOST
    with pytest.raises(ConfigError, match="'auto' is not a device backend; accepted: cuda, host"):
        backend_kind(AUTO)  # a built backend knows which one it is


def test_backends_and_domains_answer_from_the_registry() -> None:
    backend = HostBackend(device_total_bytes=1 << 20, device_count=2)
    assert backend.kind is HOST
    assert backend.name == "host"
    domain = backend.create_domain(1)
    assert domain.kind is HOST
    assert domain.host_memory
    # the CUDA domains' answers, read without a GPU (class attributes)
    assert CupyArrayDomain.kind is CUDA
    assert not CupyArrayDomain.kind.host_memory
    domain.close()


def test_a_domain_answers_from_its_kind_not_from_its_array_module() -> None:
    class DeviceLike(HostAllocationDomain):
        kind = CUDA  # a domain of device memory that happens to hand out NumPy arrays

    domain = DeviceLike(HostBackend(device_total_bytes=1 << 20), 0)
    assert domain.xp is np
    assert domain.host_memory is False
    assert "CUDA device 0" in _closed_message(domain)


def _closed_message(domain: HostAllocationDomain) -> str:
    domain.close()
    with pytest.raises(LifecycleError) as info:
        domain.empty(1, np.uint8)
    return str(info.value)


def test_the_host_device_scope_checks_the_device_and_does_nothing_else() -> None:
    backend = HostBackend(device_total_bytes=1 << 20, device_count=2)
    with backend.device_scope(1):
        pass
    with pytest.raises(ConfigError, match="device_id 2 does not exist on the host backend"):
        backend.device_scope(2)


def _backend_options() -> dict[str, argparse.Action]:
    from nexus_cache.cli.main import build_parser

    found: dict[str, argparse.Action] = {}

    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        for action in parser._actions:
            if "--backend" in action.option_strings:
                found[path] = action
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{path} {name}".strip())

    walk(build_parser(), "")
    return found


def test_every_device_backend_option_takes_its_choices_and_help_from_the_registry() -> None:
    options = {path: a for path, a in _backend_options().items() if "program-cache" not in path}
    assert {"demo", "warmup", "device report"} <= set(options)
    for path, action in options.items():
        assert tuple(action.choices or ()) == BACKEND_NAMES, path
        assert backend_help() in (action.help or ""), path
        for kind in BACKENDS:
            assert kind.summary in (action.help or ""), path


def test_the_registry_loads_no_array_library() -> None:
    code = (
        "import sys; import nexus_cache.backends.kinds; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('numpy', 'cupy', 'rmm') "
        "or m.startswith('nexus_cache.backends.') and m != 'nexus_cache.backends.kinds'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _table_rows(text: str, heading: str) -> list[list[str]]:
    """The cells of the first table after ``heading`` (header and rule skipped)."""
    lines = text[text.index(heading) :].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def _names(cell: str) -> tuple[str, ...]:
    return tuple(re.findall(r"`([a-z]+)`", cell))


def test_the_docs_backend_table_is_the_registry() -> None:
    rows = _table_rows((DOCS / "device.md").read_text(), "## Backends")
    assert [row[0] for row in rows] == [f"`{kind.name}`" for kind in BACKENDS]
    for row, kind in zip(rows, BACKENDS, strict=True):
        assert row[1] == kind.summary
        assert row[2] == ("host" if kind.host_memory else "device")
        assert row[3] == ("yes" if kind.cuda_kernels else "no")
        assert _names(row[4]) == tuple(a.name for a in kind.allocators)


def test_the_docs_settings_list_the_registry_names() -> None:
    device = (DOCS / "device.md").read_text()
    settings = {row[0]: row[1] for row in _table_rows(device, "| Setting |")}
    assert _names(settings["`NEXUS_DEVICE_BACKEND`"]) == BACKEND_NAMES
    assert _names(settings["`NEXUS_DEVICE_ALLOCATOR`"]) == ALLOCATOR_NAMES
    choices = "|".join(BACKEND_NAMES)
    for doc in ("device.md", "service.md"):
        for synopsis in re.findall(r"--backend ([a-z|]+)\]", (DOCS / doc).read_text()):
            assert synopsis == choices, doc
    for doc, column in (("configuration.md", 3), ("service.md", 4)):
        text = (DOCS / doc).read_text()
        row = next(line for line in text.splitlines() if line.startswith(f"| `{ENV}`"))
        assert _names(row.split("|")[column]) == BACKEND_NAMES, doc


def test_every_public_name_of_the_lazy_package_loads() -> None:
    import nexus_cache.backends as backends

    for name in backends.__all__:
        assert getattr(backends, name) is not None, name
    assert set(backends.__all__) <= set(dir(backends))
    with pytest.raises(AttributeError, match="is_cuda_domain"):
        getattr(backends, "is_cuda_domain")  # noqa: B009
