"""One home for settings (``docs/architecture.md``, ``docs/configuration.md``).

* Only ``nexus_cache/_env.py`` reads the environment; the writes a module
  must make for a library or a child process are listed in ``ALLOWED_WRITES``
  with their reason.
* Each package declares its variables once (a ``VARIABLES`` table of
  :class:`~nexus_cache._env.Variable`); ``docs/configuration.md`` documents
  exactly those, each with its declared default and one-line doc.
* The readers: one blank rule, one error form naming the variable, the value
  and what is accepted; sizes through ``_sizes``, numbers through ``_numbers``.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import re
from pathlib import Path

import pytest

import nexus_cache
from nexus_cache import _env
from nexus_cache._env import Variable
from nexus_cache.errors import ConfigError

ROOT = Path(nexus_cache.__file__).parent
DOCS = ROOT.parents[1] / "docs"

#: (module, variable) -> why that module writes the variable itself
ALLOWED_WRITES = {
    ("nexus_cache.cli._remote", "GRPC_VERBOSITY"): (
        "gRPC reads it when it starts: every command quiets gRPC's own log lines "
        "unless the user set it (setdefault)"
    ),
}
_WRITES = ("setdefault", "__setitem__")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_environ(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr in ("environ", "environb")
        and isinstance(node.value, ast.Name)
        and node.value.id == "os"
    )


def environment_offences(module: str, source: str) -> list[str]:
    """Every place ``source`` touches the process environment but an allowed write."""
    tree = ast.parse(source)
    allowed: set[int] = set()  # ids of the os.environ nodes of allowed writes
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _WRITES
            and _is_environ(node.func.value)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and (module, node.args[0].value) in ALLOWED_WRITES
        ):
            allowed.add(id(node.func.value))
    out = []
    for node in ast.walk(tree):
        where = f"{module}:{getattr(node, 'lineno', '?')}"
        if _is_environ(node) and id(node) not in allowed:
            out.append(f"{where}: os.{node.attr}")  # type: ignore[attr-defined]
        elif isinstance(node, ast.Attribute) and node.attr in ("getenv", "getenvb", "putenv"):
            out.append(f"{where}: {node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            names = {a.name for a in node.names} & {"environ", "environb", "getenv", "putenv"}
            out.extend(f"{where}: from os import {n}" for n in sorted(names))
    return out


def _tables() -> dict[str, tuple[Variable, ...]]:
    """``{module: VARIABLES}`` of every module that declares a table."""
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        tree = ast.parse(path.read_text("utf-8"))
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else []
            if any(isinstance(t, ast.Name) and t.id == "VARIABLES" for t in targets):
                module = _module_name(path)
                found[module] = importlib.import_module(module).VARIABLES
    return found


def _declared() -> dict[str, Variable]:
    out: dict[str, Variable] = {}
    for module, table in _tables().items():
        for variable in table:
            assert isinstance(variable, Variable), f"{module}: {variable!r}"
            assert variable.name not in out, f"{variable.name} is declared twice"
            out[variable.name] = variable
    return out


def _documented() -> dict[str, list[str]]:
    """``{variable: cells}`` of every table row of configuration.md that names one."""
    rows: dict[str, list[str]] = {}
    for line in (DOCS / "configuration.md").read_text("utf-8").splitlines():
        match = re.match(r"\| `([A-Z][A-Z0-9_]*)` \|", line)
        if match:
            assert match.group(1) not in rows, f"{match.group(1)} has two rows"
            rows[match.group(1)] = [c.strip() for c in line.strip().strip("|").split("|")]
    return rows


# --- only _env reads the environment ------------------------------------------


def test_only_the_env_module_reads_the_environment() -> None:
    offences = []
    for path in sorted(ROOT.rglob("*.py")):
        module = _module_name(path)
        if module != "nexus_cache._env":
            offences += environment_offences(module, path.read_text("utf-8"))
    assert offences == []


def test_every_allowed_write_is_still_made() -> None:
    for (module, variable), reason in ALLOWED_WRITES.items():
        assert reason
        source = (ROOT.parent / (module.replace(".", "/") + ".py")).read_text("utf-8")
        assert f'os.environ.setdefault("{variable}"' in source, f"drop {module} from the list"


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("import os\nx = os.environ.get('HOME')\n", "os.environ"),
        ("import os\nx = os.environ['HOME']\n", "os.environ"),
        ("import os\nenv = dict(os.environ)\n", "os.environ"),
        ("import os\nx = os.getenv('HOME')\n", "getenv"),
        ("from os import environ\n", "from os import environ"),
        ("from os import getenv as g\n", "from os import getenv"),
        # an allowed variable, but another module, or a read of it
        ("import os\nos.environ.setdefault('OTHER', '1')\n", "os.environ"),
        ("import os\nx = os.environ.get('GRPC_VERBOSITY')\n", "os.environ"),
    ],
)
def test_the_check_catches_a_read(source: str, found: str) -> None:
    offences = environment_offences("nexus_cache.cli._remote", source)
    assert offences
    assert found in offences[0]


def test_the_check_allows_the_listed_write_only() -> None:
    write = "import os\nos.environ.setdefault('GRPC_VERBOSITY', 'NONE')\n"
    assert environment_offences("nexus_cache.cli._remote", write) == []
    assert environment_offences("nexus_cache.server.app", write) != []


# --- the tables and the reference ----------------------------------------------


def test_every_package_declares_its_variables_in_one_table() -> None:
    tables = _tables()
    packages = {m.split(".")[1] for m in tables}
    assert len(packages) == len(tables), f"one table per package: {sorted(tables)}"
    assert packages >= {"lakehouse", "service", "server", "backends", "frames", "program"}


def test_the_reference_documents_exactly_the_declared_variables() -> None:
    declared, documented = _declared(), _documented()
    assert sorted(set(declared) - set(documented)) == [], "document these in configuration.md"
    assert sorted(set(documented) - set(declared)) == [], "declare these (or drop their rows)"
    for name, variable in declared.items():
        default, meaning = documented[name][1], documented[name][-1]
        assert default.startswith(variable.shown_default), (name, default)
        assert meaning.startswith(variable.doc), (name, meaning)


def test_a_declared_default_is_what_the_configuration_class_holds() -> None:
    from nexus_cache.lakehouse import VARIABLES as LAKE
    from nexus_cache.lakehouse import LakehouseCacheConfig
    from nexus_cache.server.settings import VARIABLES as SERVER
    from nexus_cache.server.settings import ServerSettings
    from nexus_cache.service.config import VARIABLES as SERVICE
    from nexus_cache.service.config import ServiceConfig

    for table, cls in ((LAKE, LakehouseCacheConfig), (SERVICE, ServiceConfig)):
        built = cls()
        for variable in table:
            if variable.field is not None and variable.default is not None:
                assert getattr(built, variable.field) == getattr(
                    cls(**{variable.field: variable.default}), variable.field
                ), variable.name
    server = ServerSettings()
    for variable in SERVER:
        if variable.field is not None:
            assert _env.read(variable, {}) == getattr(server, variable.field), variable.name


def test_the_lakehouse_variables_reach_their_fields_in_both_loaders(tmp_path: Path) -> None:
    # One table: LakehouseCacheConfig.from_env and the service's loader read the
    # same variables into the same fields.
    from nexus_cache.lakehouse import VARIABLES, LakehouseCacheConfig
    from nexus_cache.service import ServiceConfig

    values = {
        "root": str(tmp_path),
        "read": "disabled",
        "policy": "read_through",
        "max_bytes": "1M",
        "fill_max_concurrency": "2",
        "fill_max_host_bytes": "3M",
        "bypass_bytes": "4M",
        "fill_exit_wait_s": "5",
        "log_reads": "yes",
        "identity_ttl_s": "6",
    }
    assert {v.field for v in VARIABLES} == set(values)
    environ = {v.name: values[str(v.field)] for v in VARIABLES}
    direct = LakehouseCacheConfig.from_env(environ)
    assert direct == ServiceConfig.from_env(environ).lakehouse
    assert direct != LakehouseCacheConfig()
    for field in values:
        assert getattr(direct, field) != getattr(LakehouseCacheConfig(), field), field


# --- the readers ---------------------------------------------------------------


def _var(kind: str, **kwargs: object) -> Variable:
    return Variable("NEXUS_TEST_SETTING", kind, "A test setting.", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("variable", "default"),
    [
        (_var("size", default="64M"), 64 << 20),
        (_var("int", default="4", minimum=1), 4),
        (_var("float", default="2.5"), 2.5),
        (_var("bool", default="off"), False),
        (_var("enum", default="auto", choices=("auto", "host")), "auto"),
        (_var("path", unset="none"), None),
        (_var("str", unset="none"), None),
    ],
)
@pytest.mark.parametrize("blank", [None, "", "   ", "\t\n"])
def test_blank_means_unset_for_every_kind(
    variable: Variable, default: object, blank: str | None
) -> None:
    environ = {} if blank is None else {variable.name: blank}
    assert _env.raw(variable, environ) is None
    assert _env.read(variable, environ) == default


@pytest.mark.parametrize(
    ("variable", "text", "value"),
    [
        (_var("size", unset="none"), " 10GiB ", 10 << 30),
        (_var("size", unset="none"), "500MB", 500 * 10**6),
        (_var("size", unset="none", minimum=0), "0", 0),
        (_var("int", unset="none", minimum=1, maximum=64), " 3 ", 3),
        (_var("float", unset="none", minimum=0, unit="seconds"), "1e3", 1000.0),
        (_var("bool", unset="none"), " YES ", True),
        (_var("enum", unset="none", choices=("auto", "host")), " Host ", "host"),
        (_var("path", unset="none"), " ~/x ", Path.home() / "x"),
        (_var("str", unset="none"), " grpc://h:1 ", "grpc://h:1"),
    ],
)
def test_each_reader_parses_its_kind(variable: Variable, text: str, value: object) -> None:
    assert _env.read(variable, {variable.name: text}) == value


@pytest.mark.parametrize(
    ("variable", "text", "accepted"),
    [
        (_var("size", unset="none"), "0", "a positive byte size"),
        (_var("size", unset="none"), "12 apples", "is not a byte size; use a whole number"),
        (
            _var("int", unset="none", minimum=1, maximum=64),
            "65",
            "use a whole number from 1 to 64",
        ),
        (_var("int", unset="none", minimum=1), "1_0", "use a whole number >= 1"),
        (_var("int", unset="none", minimum=1), "\u0661", "use a whole number >= 1"),
        (_var("float", unset="none", minimum=0, unit="seconds"), "nan", "of seconds >= 0"),
        (_var("float", unset="none", minimum=0), "inf", "use a finite number >= 0"),
        (_var("float", unset="none", minimum=0), "-1", "use a finite number >= 0"),
        (
            _var("float", unset="none", minimum=0, strict=True, maximum=1024),
            "0",
            "use a finite number > 0 and <= 1024",
        ),
        (_var("bool", unset="none"), "maybe", "use 1/true/yes/on or 0/false/no/off"),
        (_var("enum", unset="none", choices=("auto", "host")), "gpu", "use one of: auto, host"),
    ],
)
def test_a_refused_value_names_the_variable_the_value_and_what_is_accepted(
    variable: Variable, text: str, accepted: str
) -> None:
    with pytest.raises(ConfigError) as info:
        _env.read(variable, {variable.name: text})
    message = str(info.value)
    assert message.startswith(f"{variable.name}={text!r} ")
    assert accepted in message


def test_a_declared_default_the_reader_refuses_is_refused_at_declaration() -> None:
    with pytest.raises(ConfigError, match="NEXUS_TEST_SETTING='lots'"):
        _var("size", default="lots")
    with pytest.raises(ValueError, match="unset"):
        _var("int")


def test_the_readers_read_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    variable = _var("int", default="1", minimum=1)
    monkeypatch.setenv(variable.name, "7")
    assert _env.read(variable) == 7
    monkeypatch.setenv(variable.name, " ")
    assert _env.read(variable) == 1


def test_read_fields_gives_the_set_texts_by_field() -> None:
    table = (
        _var("int", default="1", field="a"),
        dataclasses.replace(_var("str", unset="x"), name="N2", field="b"),
    )
    assert _env.read_fields(table, {"NEXUS_TEST_SETTING": " 5 ", "N2": "  "}) == {"a": " 5 "}


# --- behaviour kept at the sites that moved to the readers ---------------------


def test_the_sites_keep_their_variables_defaults_and_refusals(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from nexus_cache.backends import HostBackend, select_backend
    from nexus_cache.frames._page_engine import engine_setting
    from nexus_cache.frames._pool import decode_settings
    from nexus_cache.graph._host_engine import host_kernels
    from nexus_cache.program import default_filestream_root, default_redis_url

    for name in ("NEXUS_HOST_DEVICE_COUNT", "NEXUS_HOST_DEVICE_TOTAL_BYTES"):
        monkeypatch.setenv(name, "  ")
    assert HostBackend().device_count() == 1
    monkeypatch.setenv("NEXUS_HOST_DEVICE_COUNT", "65")
    with pytest.raises(ConfigError, match=r"NEXUS_HOST_DEVICE_COUNT='65'.*from 1 to 64"):
        HostBackend()
    monkeypatch.delenv("NEXUS_HOST_DEVICE_COUNT")
    monkeypatch.setenv("NEXUS_DEVICE_BACKEND", " HOST ")
    assert select_backend().kind.name == "host"
    monkeypatch.setenv("NEXUS_DEVICE_BACKEND", "tpu")
    with pytest.raises(ConfigError, match=r"NEXUS_DEVICE_BACKEND='tpu'.*auto, cuda, host"):
        select_backend()
    monkeypatch.setenv("NEXUS_DECODE_ENGINE", "")
    assert engine_setting(None) == ("host", "the default")
    monkeypatch.setenv("NEXUS_DECODE_THREADS", "3")
    monkeypatch.setenv("NEXUS_DECODE_WINDOW_BYTES", " ")
    assert decode_settings() == (3, 3 * (64 << 20))
    monkeypatch.setenv("NEXUS_GRAPH_HOST_ENGINE", "fast")
    with pytest.raises(ConfigError, match=r"NEXUS_GRAPH_HOST_ENGINE='fast'.*auto, numba, numpy"):
        host_kernels()
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/dir")  # the XDG spec: ignored
    monkeypatch.setenv("NEXUS_PROGRAM_CACHE_DIR", "\t")
    assert default_filestream_root() == Path.home() / ".cache/nexus-cache/program-cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_filestream_root() == tmp_path / "nexus-cache/program-cache"
    monkeypatch.setenv("NEXUS_PROGRAM_CACHE_REDIS_URL", " redis://h:6379/0 ")
    assert default_redis_url() == "redis://h:6379/0"
