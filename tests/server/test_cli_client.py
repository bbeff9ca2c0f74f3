"""The CLI and the client as users meet them: Ctrl-C on a ``--server`` client,
a private CA for ``grpc+tls://``, failed calls that say what happened, and
``serve`` refusing what it can before its warm-up. Real server processes on
loopback, real CLI processes, certificates made in the test."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from nexus_cache.client import Client
from nexus_cache.errors import (
    ConfigError,
    GrantTooLargeError,
    QueryCancelledError,
    ServerError,
    ServerUnavailableError,
)
from nexus_cache.service.datagen import fact_table, ring_edges, write_parquet

from ._helpers import (
    Server,
    admission_decisions,
    close_all,
    end_processes,
    run_cli,
    server_env,
    start_server,
    wait_until,
)

# A PageRank that runs for hours (alpha near 1 on a ring: see ring_edges).
_SLOW = ["--alpha", "0.99999", "--tol", "1e-300", "--max-iter", "100000000"]
_SLOW_PARAMS = {"alpha": 0.99999, "tol": 1e-300, "max_iter": 10**8}
# what gRPC writes to stderr on its own (absl's preamble, its E/I/W lines)
_GRPC_NOISE = ("E0000", "I0000", "W0000", "absl::InitializeLog", "ssl_transport_security")
_START_HINT = "start it with `nexus-cache serve`"


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lake")
    write_parquet(ring_edges(100_000), root / "ring.parquet", row_groups=2)
    write_parquet(fact_table(5000), root / "facts.parquet", row_groups=2)
    past = time.time() - 60  # older than local_min_age_s: the identity is provable
    for path in root.iterdir():
        os.utime(path, (past, past))
    return root


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, dict[str, str]]]:
    root = tmp_path_factory.mktemp("served")
    env = server_env(root, NEXUS_SERVICE_EVIDENCE_DIR=str(root / "evidence"))
    server = start_server(env)
    try:
        yield server, env
    finally:
        close_all([server])


def _openssl(*args: str) -> None:
    made = subprocess.run(["openssl", *args], capture_output=True, check=False)
    if made.returncode != 0:
        pytest.skip(f"openssl could not make a certificate: {made.stderr[-200:]!r}")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private CA, a server certificate it signs (localhost, 127.0.0.1), and a
    second CA that signs nothing of the server's."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make certificates")
    d = tmp_path_factory.mktemp("pki")
    for ca in ("ca", "other"):
        _openssl(
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", f"/CN={ca} test CA", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign",
            "-keyout", str(d / f"{ca}.key"), "-out", str(d / f"{ca}.pem"),
        )  # fmt: skip
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
        "-keyout", str(d / "server.key"), "-out", str(d / "server.csr"),
    )  # fmt: skip
    (d / "ext.cnf").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    _openssl(
        "x509", "-req", "-in", str(d / "server.csr"), "-CA", str(d / "ca.pem"),
        "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-days", "1",
        "-extfile", str(d / "ext.cnf"), "-out", str(d / "server.pem"),
    )  # fmt: skip
    return d


@pytest.fixture(scope="module")
def tls_served(
    tmp_path_factory: pytest.TempPathFactory, pki: Path
) -> Iterator[tuple[Server, dict[str, str]]]:
    env = server_env(tmp_path_factory.mktemp("tls"))
    server = start_server(
        env, "--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server.key")
    )
    try:
        yield server, env
    finally:
        close_all([server])


def _one_line(cli: subprocess.CompletedProcess[str]) -> str:
    """The CLI's stderr, which must be one error line and nothing of gRPC's own."""
    for noise in _GRPC_NOISE:
        assert noise not in cli.stderr, cli.stderr
    (line,) = cli.stderr.strip().splitlines()
    assert line.startswith("nexus-cache: error: "), line
    return line


# -- Ctrl-C -------------------------------------------------------------------------------------


def _ctrl_c_exits(cli: subprocess.Popen[str], within: float) -> None:
    """SIGINT ``cli``: it exits with 130 within ``within`` s, no traceback."""
    interrupted = time.monotonic()
    cli.send_signal(signal.SIGINT)
    code = cli.wait(timeout=30)
    took = time.monotonic() - interrupted
    _out, err = cli.communicate(timeout=30)
    assert code == 130, err
    assert took < within, f"exit {took:.1f} s after SIGINT"
    assert "Traceback" not in err


def test_ctrl_c_on_a_server_client_exits_130_at_once_and_the_server_cancels(
    served: tuple[Server, dict[str, str]], lake: Path
) -> None:
    server, env = served
    evidence = Path(env["NEXUS_SERVICE_EVIDENCE_DIR"])
    before = len(admission_decisions(evidence))
    attempts = set(evidence.glob("attempt-*.json"))
    ring = str(lake / "ring.parquet")
    graph = ["graph", "pagerank", ring, "--src", "src", "--dst", "dst", *_SLOW]
    cli = subprocess.Popen(
        [sys.executable, "-m", "nexus_cache.cli.main", *graph, "--server", server.url],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # the PageRank holds its grant and iterates on the server
        assert wait_until(lambda: admission_decisions(evidence)[before:] == ["admitted"], 60)
        _ctrl_c_exits(cli, within=5)  # about 0.2 s when quiet
        # the server cancelled that very query: its evidence, its log line (by the
        # query id) and its grant say so
        assert wait_until(lambda: len(set(evidence.glob("attempt-*.json")) - attempts) == 1)
        (attempt,) = set(evidence.glob("attempt-*.json")) - attempts
        document = json.loads(attempt.read_text())
        assert document["outcome"] == "cancelled"
        line = server.wait_for(rf"query {document['query_id']} .* cancelled ", timeout=10).string
        assert ring in line
        assert " ok " not in line
        assert wait_until(
            lambda: admission_decisions(evidence)[before:] == ["admitted", "cancelled"]
        )
        with Client(server.url) as client:
            assert wait_until(lambda: client.health()["running_queries"] == 0, timeout=10)
            (report,) = client.reports()
            assert report["grant_bytes"] == 0
    finally:
        end_processes([cli])


def test_client_execute_raises_keyboard_interrupt_at_once(
    served: tuple[Server, dict[str, str]], lake: Path
) -> None:
    server, env = served
    evidence = Path(env["NEXUS_SERVICE_EVIDENCE_DIR"])
    before = len(admission_decisions(evidence))
    code = (
        "import sys, time\n"
        "from nexus_cache.client import Client\n"
        "from nexus_cache.service import GraphQuery, Scan\n"
        f"q = GraphQuery(Scan(sys.argv[2]), 'src', 'dst', 'pagerank', params={_SLOW_PARAMS!r})\n"
        "try:\n"
        "    Client(sys.argv[1]).execute(q)\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted', time.monotonic(), flush=True)\n"
    )
    python = subprocess.Popen(
        [sys.executable, "-c", code, server.url, str(lake / "ring.parquet")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert wait_until(lambda: admission_decisions(evidence)[before:] == ["admitted"], 60)
        sent = time.monotonic()
        python.send_signal(signal.SIGINT)
        out, err = python.communicate(timeout=30)
        assert python.returncode == 0, err
        word, when = out.split()
        assert word == "interrupted"
        assert float(when) - sent < 5  # not when the hours-long result arrives
        assert wait_until(
            lambda: admission_decisions(evidence)[before:] == ["admitted", "cancelled"]
        )
    finally:
        end_processes([python])


# A Flight server that takes every query and never answers, nor a cancel: the
# CLI's call is still inside gRPC when the CLI exits.
_DEAF_SERVER = """
import sys, threading, time
from pathlib import Path
import pyarrow.flight as flight

class Deaf(flight.FlightServerBase):
    def do_get(self, context, ticket):
        Path(sys.argv[1]).write_text("called")
        threading.Event().wait(600)

    def do_action(self, context, action):
        threading.Event().wait(600)

server = Deaf("grpc://127.0.0.1:0")
print(server.port, flush=True)
server.serve()
"""


def test_ctrl_c_exits_130_at_once_while_the_server_answers_nothing(
    lake: Path, tmp_path: Path
) -> None:
    called = tmp_path / "called"
    deaf = subprocess.Popen(
        [sys.executable, "-c", _DEAF_SERVER, str(called)], stdout=subprocess.PIPE, text=True
    )
    cli = None
    try:
        assert deaf.stdout is not None
        port = int(deaf.stdout.readline())
        command = ["scan", str(lake / "ring.parquet"), "--server", f"grpc://127.0.0.1:{port}"]
        torn_down = tmp_path / "torn-down"
        # the console script, with an exit hook that the interpreter's teardown runs
        script = (
            "import atexit, pathlib, sys\n"
            "atexit.register(pathlib.Path(sys.argv.pop(1)).touch)\n"
            "from nexus_cache.cli.main import entry\n"
            "entry()\n"
        )
        cli = subprocess.Popen(
            [sys.executable, "-c", script, str(torn_down), *command],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert wait_until(called.exists, 60)
        # the cancel (2 s at most) and the wait for the call (1 s) are all it takes;
        # no crash in gRPC's teardown under the call that never returned
        _ctrl_c_exits(cli, within=6)
        assert not torn_down.exists()  # exited with the call live: no teardown
    finally:
        end_processes([cli, deaf])


# A notebook: Ctrl-C interrupts a query, the process goes on (here: waits on
# stdin). The client's debug line names the id it sent the query under.
_NOTEBOOK = f"""
import logging, sys
from nexus_cache.client import Client
from nexus_cache.service import GraphQuery, Scan
logging.basicConfig(stream=sys.stdout, format="%(name)s: %(message)s")
logging.getLogger("nexus_cache.client").setLevel(logging.DEBUG)
q = GraphQuery(Scan(sys.argv[2]), "src", "dst", "pagerank", params={_SLOW_PARAMS!r})
client = Client(sys.argv[1])
while True:
    try:
        client.execute(q)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        break
sys.stdin.readline()
print("still here", flush=True)
"""


def test_ctrl_c_in_a_process_that_goes_on_cancels_its_query_on_the_server(
    served: tuple[Server, dict[str, str]], lake: Path
) -> None:
    server, env = served
    evidence = Path(env["NEXUS_SERVICE_EVIDENCE_DIR"])
    before = len(admission_decisions(evidence))
    notebook = subprocess.Popen(
        [sys.executable, "-c", _NOTEBOOK, server.url, str(lake / "ring.parquet")],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []

    def pump() -> None:
        assert notebook.stdout is not None
        for line in notebook.stdout:
            lines.append(line.strip())

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        assert wait_until(lambda: admission_decisions(evidence)[before:] == ["admitted"], 60)
        notebook.send_signal(signal.SIGINT)
        assert wait_until(lambda: "interrupted" in lines, 10), lines
        (sent,) = [line for line in lines if "cancel sent" in line]
        query_id = re.search(r"query (\w+): cancel sent .*\(found: True\)", sent)
        assert query_id is not None, sent
        # within a few seconds the server cancelled that very query (its log line
        # names it by the id the client sent) and its grant is back, while the
        # process that sent it still runs and keeps its connection
        line = server.wait_for(rf"query {query_id.group(1)} .* cancelled ", timeout=10).string
        assert str(lake / "ring.parquet") in line
        assert wait_until(
            lambda: admission_decisions(evidence)[before:] == ["admitted", "cancelled"], 10
        )
        with Client(server.url) as client:
            assert wait_until(lambda: client.health()["running_queries"] == 0, timeout=10)
            (report,) = client.reports()
            assert report["grant_count"] == 0
            assert report["grant_bytes"] == 0
        assert notebook.poll() is None
        assert notebook.stdin is not None
        assert notebook.stderr is not None
        notebook.stdin.write("\n")
        notebook.stdin.close()
        code = notebook.wait(30)
        reader.join(10)
        err = notebook.stderr.read()
        assert code == 0, err
        assert lines[-1] == "still here"
        assert "Traceback" not in err
    finally:
        if notebook.poll() is None:
            notebook.kill()
        notebook.wait(30)
        reader.join(10)
        for pipe in (notebook.stdin, notebook.stdout, notebook.stderr):
            if pipe is not None:
                pipe.close()


# -- TLS with a private CA ----------------------------------------------------------------------


def test_the_cli_trusts_a_private_ca_from_its_option_or_variable(
    tls_served: tuple[Server, dict[str, str]], pki: Path, lake: Path
) -> None:
    server, env = tls_served
    facts = str(lake / "facts.parquet")
    by_option = run_cli(
        env, "scan", facts, "--limit", "0", "--server", server.url,
        "--tls-root-certs", str(pki / "ca.pem"),
    )  # fmt: skip
    assert by_option.returncode == 0, by_option.stderr
    assert "5000 rows" in by_option.stdout
    by_variable = run_cli(
        {**env, "NEXUS_SERVER_TLS_ROOT_CERTS": str(pki / "ca.pem")},
        "scan", facts, "--limit", "0", "--server", server.url.replace("127.0.0.1", "localhost"),
    )  # fmt: skip
    assert by_variable.returncode == 0, by_variable.stderr
    assert "5000 rows" in by_variable.stdout
    for cli in (by_option, by_variable):
        assert not any(noise in cli.stderr for noise in _GRPC_NOISE), cli.stderr
    # the library takes the path as well as the PEM bytes
    for roots in (pki / "ca.pem", str(pki / "ca.pem"), (pki / "ca.pem").read_bytes()):
        with Client(server.url, tls_root_certs=roots) as client:
            assert client.execute({"type": "count", "source": facts}).table.num_rows == 1


def test_tls_failures_say_what_happened_without_grpc_noise(
    tls_served: tuple[Server, dict[str, str]],
    served: tuple[Server, dict[str, str]],
    pki: Path,
    lake: Path,
) -> None:
    tls, env = tls_served
    plain, _ = served
    facts = str(lake / "facts.parquet")
    scan = ["scan", facts, "--limit", "0"]

    untrusted = _one_line(
        run_cli(env, *scan, "--server", tls.url, "--tls-root-certs", str(pki / "other.pem"))
    )
    assert "certificate this client does not trust" in untrusted
    assert "--tls-root-certs" in untrusted
    assert _START_HINT not in untrusted
    no_roots = _one_line(run_cli(env, *scan, "--server", tls.url))
    assert "does not trust" in no_roots
    assert _START_HINT not in no_roots

    plain_to_tls = _one_line(run_cli(env, *scan, "--server", tls.url.replace("+tls", "")))
    assert "use grpc+tls://" in plain_to_tls
    assert _START_HINT not in plain_to_tls
    tls_to_plain = _one_line(
        run_cli(
            env,
            *scan,
            "--server",
            plain.url.replace("grpc://", "grpc+tls://"),
            "--tls-root-certs",
            str(pki / "ca.pem"),
        )
    )
    assert "does not speak TLS" in tls_to_plain
    assert _START_HINT not in tls_to_plain

    not_pem = pki / "ext.cnf"
    bad_roots = run_cli(env, *scan, "--server", tls.url, "--tls-root-certs", str(not_pem))
    assert bad_roots.returncode == 2
    line = _one_line(bad_roots)
    assert str(not_pem) in line
    assert "holds no PEM certificate" in line
    with pytest.raises(ConfigError, match="cannot be read"):
        Client(tls.url, tls_root_certs=pki / "missing.pem")


# -- other failures of a running server ---------------------------------------------------------


def test_a_call_past_its_timeout_is_a_timeout_not_a_server_to_start(
    served: tuple[Server, dict[str, str]], lake: Path
) -> None:
    server, env = served
    evidence = Path(env["NEXUS_SERVICE_EVIDENCE_DIR"])
    before = len(admission_decisions(evidence))
    edges = {"type": "scan", "source": str(lake / "ring.parquet")}
    query = {"type": "graph", "edges": edges, "src": "src", "dst": "dst"}
    from nexus_cache.errors import ServerTimeoutError

    late = pytest.raises(ServerTimeoutError, match=r"did not answer within timeout=1 s")
    with Client(server.url, timeout=1.0) as client, late as info:
        client.execute({**query, "algorithm": "pagerank", "params": _SLOW_PARAMS})
    assert _START_HINT not in str(info.value)
    assert isinstance(info.value, TimeoutError)
    # the server cancelled the query whose client gave up
    assert wait_until(lambda: admission_decisions(evidence)[before:] == ["admitted", "cancelled"])


def test_a_server_shutting_down_says_so(tmp_path: Path, lake: Path) -> None:
    env = server_env(tmp_path, NEXUS_SERVER_SHUTDOWN_TIMEOUT_S="120")
    server = start_server(env)
    running = None
    try:
        code = (
            "import sys\nimport pyarrow.flight as f\n"
            "print('asking', flush=True)\n"
            "f.connect(sys.argv[1]).do_get(f.Ticket(sys.argv[2].encode())).read_all()\n"
        )
        edges = {"type": "scan", "source": str(lake / "ring.parquet")}
        query = {"type": "graph", "edges": edges, "src": "src", "dst": "dst"}
        ticket = json.dumps({**query, "algorithm": "pagerank", "params": _SLOW_PARAMS})
        running = subprocess.Popen(
            [sys.executable, "-c", code, server.url, ticket],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        with Client(server.url) as client:
            assert wait_until(lambda: client.health()["running_queries"] == 1, 60)
        server.process.send_signal(signal.SIGTERM)  # waits for the running PageRank
        server.wait_for(r"stopping: refusing new queries")
        cli = run_cli(env, "scan", str(lake / "facts.parquet"), "--server", server.url)
        line = _one_line(cli)
        assert "shutting down" in line
        assert _START_HINT not in line
        assert cli.returncode == 2
    finally:
        end_processes([running])
        close_all([server])


def test_errors_are_classified_by_their_content_not_their_flight_class() -> None:
    from nexus_cache.client._errors import translated_error

    url = "grpc://127.0.0.1:1"
    info = json.dumps({"error": "GrantTooLargeError", "message": "too large: use less"}).encode()
    # item by item the server may answer with another status code, so another class
    for cls in (
        flight.FlightServerError,
        flight.FlightInternalError,
        flight.FlightUnavailableError,
        flight.FlightCancelledError,
        flight.FlightTimedOutError,
    ):
        error = translated_error(cls("too large: use less", extra_info=info), url, None)
        assert type(error) is GrantTooLargeError, cls
        assert str(error) == "too large: use less"
    cancelled = json.dumps({"error": "QueryCancelledError", "message": "gone"}).encode()
    assert isinstance(
        translated_error(flight.FlightCancelledError("gone", extra_info=cancelled), url, None),
        QueryCancelledError,
    )
    # an Arrow status without our JSON: the server's text, never "start the server"
    for exc in (pa.ArrowInvalid("bad query"), pa.ArrowKeyError("no such source")):
        error = translated_error(exc, url, None)
        assert type(error) is ServerError
        assert _START_HINT not in str(error)
    shutting = flight.FlightUnavailableError(
        "the nexus-cache server is shutting down; retry against a running server"
    )
    error = translated_error(shutting, url, None)
    assert isinstance(error, ServerUnavailableError)
    assert _START_HINT not in str(error)
    refused = flight.FlightUnavailableError(
        "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: "
        "Failed to connect to remote host: Connection refused"
    )
    assert _START_HINT in str(translated_error(refused, url, None))


# -- serve: refused before the warm-up ----------------------------------------------------------


def test_serve_refuses_a_taken_port_before_its_warm_up(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = server_env(tmp_path)
        for args in (["--port", str(port)], ["--port", "0", "--metrics-port", str(port)]):
            cli = run_cli(env, "serve", *args)
            assert cli.returncode == 2
            assert "warm-up" not in cli.stderr  # refused before it, not seconds after
            line = _one_line(cli)
            assert "cannot listen on " in line
            assert f"={port} is taken" in line


def test_serve_refuses_metrics_without_prometheus_client_before_its_warm_up(
    tmp_path: Path,
) -> None:
    hidden = tmp_path / "hidden"
    (hidden / "prometheus_client").mkdir(parents=True)
    (hidden / "prometheus_client" / "__init__.py").write_text(
        "raise ImportError('No module named prometheus_client (hidden by the test)')\n"
    )
    env = server_env(tmp_path)
    env["PYTHONPATH"] = os.pathsep.join([str(hidden), env["PYTHONPATH"]])
    cli = run_cli(env, "serve", "--port", "0", "--metrics-port", "0")
    assert cli.returncode == 2
    assert "warm-up" not in cli.stderr
    line = _one_line(cli)
    assert "--metrics-port needs prometheus-client" in line


def test_serve_refuses_a_key_that_is_not_the_certificates_before_its_warm_up(
    tmp_path: Path, pki: Path
) -> None:
    cli = run_cli(
        server_env(tmp_path), "serve", "--port", "0",
        "--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "other.key"),
    )  # fmt: skip
    assert cli.returncode == 2
    assert "warm-up" not in cli.stderr
    line = _one_line(cli)
    assert "--tls-cert=" in line
    assert "cannot be used together" in line


# -- what a remote scan imports -----------------------------------------------------------------

_IMPORTS = """
import json, sys
from nexus_cache.cli.main import main
code = main(["scan", sys.argv[2], "--server", sys.argv[1], "--limit", "1"])
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""
# what a query sent to a server does not need: the service and its caches, the
# device, frame and graph code, fsspec, the other commands' modules
_NOT_NEEDED = (
    "nexus_cache.service.service",
    "nexus_cache.service._runner",
    "nexus_cache.service.warmup",
    "nexus_cache.lakehouse",
    "nexus_cache.device",
    "nexus_cache.frames",
    "nexus_cache.backends.host",
    "nexus_cache.graph._build",
    "nexus_cache.graph.csr",
    "nexus_cache.graph.traversal",
    "fsspec",
    "nexus_cache.cli.demo",
    "nexus_cache.cli.graph",
    "nexus_cache.cli.lakehouse",
    "nexus_cache.cli.program",
    "nexus_cache.cli.serve",
)


def test_a_remote_scan_imports_only_what_it_needs(
    served: tuple[Server, dict[str, str]], lake: Path
) -> None:
    server, env = served
    done = subprocess.run(
        [sys.executable, "-c", _IMPORTS, server.url, str(lake / "facts.parquet")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    doc = json.loads(done.stdout.strip().splitlines()[-1])
    assert doc["code"] == 0, done.stderr
    loaded = [
        m for m in doc["modules"] if any(m == n or m.startswith(n + ".") for n in _NOT_NEEDED)
    ]
    assert loaded == []
