"""Shared fixtures for the pathways Python tests.

All tests of one pytest process share the default runtime (2 islands x 2 hosts
x 4 devices = 16 "tpu" devices). Tests that need another topology, or a fresh
resource manager (placement depends on which slices are alive), run Python in
a subprocess with `run_python`.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

try:
    import pathways as pw
except ModuleNotFoundError as e:  # Not installed and not on PYTHONPATH: use the source tree.
    if e.name != "pathways":
        raise
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python"))
    import pathways as pw

def pytest_addoption(parser):
    parser.addoption(
        "--hosts", default="in_process", choices=("in_process", "local_processes", "service"),
        help="where the runtime's hosts run: threads of the test process (default), one process per host, or "
             "a pathways-server's host processes, which this process shares with a second client process")


# --hosts=service: the pathways-server, and a second tenant that keeps the
# islands busy with programs of its own (and checks their numbers) while
# the tests run.
_SERVICE: dict = {}

def _start_service(tmp: pathlib.Path) -> str:
    connection = tmp / "pathways-server.json"
    env = {k: v for k, v in os.environ.items() if k not in ("PATHWAYS_TOPOLOGY", "PATHWAYS_SERVER")}
    env["PYTHONPATH"] = os.pathsep.join([str(PYTHON_DIR)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    server = subprocess.Popen(
        [sys.executable, "-m", "pathways.server", f"--connection-file={connection}",
         "--topology=islands=2,hosts_per_island=2,devices_per_host=4"],
        stdout=subprocess.PIPE, stderr=open(tmp / "server.err", "wb"), env=env)
    _SERVICE["server"] = server
    line = server.stdout.readline().decode()
    if not line.startswith("pathways-server ready"):
        raise RuntimeError(f"pathways-server did not start: {line!r}\n{(tmp / 'server.err').read_text()}")
    other = subprocess.Popen([sys.executable, "-c", _OTHER_TENANT_LOOP, str(connection)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=open(tmp / "other.err", "wb"), env=env)
    _SERVICE["other"] = other
    line = other.stdout.readline().decode()
    if not line.startswith("other tenant ready"):
        raise RuntimeError(f"the second tenant did not start: {line!r}\n{(tmp / 'other.err').read_text()}")
    _SERVICE["tmp"] = tmp
    _SERVICE["connection"] = str(connection)
    return str(connection)


# The second tenant: a loop of programs, each result checked, until its
# stdin closes; it prints how many it ran and exits 0 if all were right.
_OTHER_TENANT_LOOP = """
import os, sys, threading, numpy as np, pathways as pw
pw.configure(server=sys.argv[1], name="other-tenant", memory="32MiB")
devices = pw.make_virtual_device_set().add_slice(tpu_devices=4).tpus
f = pw.pmap(lambda x: x * 3.0 + pw.psum(x, "i"), devices=devices, axis_name="i")
x = np.arange(4, dtype=np.float32)
want = x * 3.0 + x.sum()
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
np.testing.assert_array_equal(np.asarray(f(x)), want)
print("other tenant ready", flush=True)
runs = 0
while not stop.wait(0.002):
    np.testing.assert_array_equal(np.asarray(f(x)), want)
    runs += 1
print(f"other tenant ran {runs} programs, all right", flush=True)
"""


def _stop_service() -> None:
    other, server = _SERVICE.pop("other", None), _SERVICE.pop("server", None)
    if other is not None:
        other.stdin.close()
        out = other.stdout.read().decode()
        code = other.wait(timeout=60)
        if code != 0 or "all right" not in out:
            err = (_SERVICE["tmp"] / "other.err").read_text()
            raise RuntimeError(f"the second tenant failed ({code}): {out}\n{err}")
    if server is not None:
        server.terminate()
        server.wait(timeout=30)


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "in_process_only(reason): needs what host processes do not have yet (issue 8); skipped with --hosts "
        "other than in_process, the reason shown")
    config.addinivalue_line(
        "markers",
        "not_service(reason): not for a service's tenant (its topology and hosts are the service's); skipped "
        "with --hosts=service, the reason shown")
    hosts = config.getoption("--hosts")
    if hosts == "service":
        import tempfile

        # Half of each device's memory for the tests (the service's default
        # is an eighth: the tenants they start in subprocesses get that).
        pw.configure(server=_start_service(pathlib.Path(tempfile.mkdtemp(prefix="pathways-service-"))),
                     memory="512MiB")
    elif hosts != "in_process":
        pw.configure(hosts=hosts)


def pytest_unconfigure(config):
    if config.getoption("--hosts") == "service":
        _stop_service()


def pytest_collection_modifyitems(config, items):
    hosts = config.getoption("--hosts")
    if hosts == "in_process":
        return
    for item in items:
        mark = item.get_closest_marker("in_process_only")
        if mark is not None:
            item.add_marker(pytest.mark.skip(reason="in process only for now: " + mark.args[0]))
        mark = item.get_closest_marker("not_service")
        if hosts == "service" and mark is not None:
            item.add_marker(pytest.mark.skip(reason="not for a service's tenant: " + mark.args[0]))


def pytest_report_header(config):
    return f"pathways hosts: {config.getoption('--hosts')}"


# Subprocesses import the same package as this process.
PYTHON_DIR = pathlib.Path(pw.__file__).resolve().parents[1]


def get_devices(n: int) -> list:
    """Allocates `n` virtual TPU devices on an island (as in Figure 2)."""
    device_set = pw.make_virtual_device_set()
    return device_set.add_slice(tpu_devices=n).tpus


@pytest.fixture
def devices_of():
    """Returns `get_devices`: n -> a fresh slice's virtual TPUs."""
    return get_devices


_CHECK = {}


def assert_runtime_works() -> None:
    """Runs a small pmap with a psum and checks its numbers.

    Used after every error case: an error must leave the runtime usable.
    """
    if "f" not in _CHECK:
        _CHECK["f"] = pw.pmap(
            lambda x: x * 2.0 + pw.psum(x, "i"), devices=get_devices(2), axis_name="i"
        )
    out = _CHECK["f"](np.array([1.0, 2.0]))
    np.testing.assert_array_equal(np.asarray(out), [5.0, 7.0])
    # A fresh trace too, so that no tracing state was left behind.
    g = pw.pmap(lambda x: -x / 4.0, devices=get_devices(2))
    np.testing.assert_array_equal(np.asarray(g(np.array([4.0, 8.0], np.float32))), [-1.0, -2.0])


@pytest.fixture
def runtime_ok():
    """Returns `assert_runtime_works`."""
    return assert_runtime_works


def hosts_env(hosts: str | None = None) -> dict | None:
    """The environment that puts a subprocess's runtime where this session's hosts are.

    None in process; PATHWAYS_TOPOLOGY=hosts=... for host processes; with
    --hosts=service, PATHWAYS_SERVER: the subprocess is one more tenant.
    """
    if hosts is None:
        hosts = pw.topology()["hosts"]
    if hosts == "in_process":
        return None
    if hosts == "service":
        return {"PATHWAYS_SERVER": _SERVICE["connection"]}
    return {"PATHWAYS_TOPOLOGY": f"hosts={hosts}"}


def run_python_process(code: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh Python process (this package, no PATHWAYS_TOPOLOGY or PATHWAYS_SERVER unless in
    `env`)."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("PATHWAYS_TOPOLOGY", "PATHWAYS_SERVER")}
    full_env["PYTHONPATH"] = os.pathsep.join(
        [str(PYTHON_DIR)] + ([full_env["PYTHONPATH"]] if full_env.get("PYTHONPATH") else [])
    )
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_python(code: str, env: dict | None = None, timeout: float = 120) -> str:
    """Runs `code` in a fresh Python process; returns its stdout, failing on a non-zero exit."""
    proc = run_python_process(code, env, timeout)
    assert proc.returncode == 0, (
        f"subprocess failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    )
    return proc.stdout


def runner_with_suite_hosts(config, prelude: str):
    """`run(code)`: runs `prelude` + `code` in a fresh process whose runtime has the suite's hosts
    (`--hosts`; its own, for host processes), for what must not touch the suite's runtime (failed
    devices stay failed); returns its stdout."""
    hosts = config.getoption("--hosts")
    configure = "" if hosts == "in_process" else f"pw.configure(hosts={hosts!r})\n"
    return lambda code: run_python(prelude + configure + code)


@pytest.fixture
def python_subprocess():
    """Returns `run_python(code, env=None)`."""
    return run_python


@pytest.fixture(autouse=True, scope="module")
def _quiesce_after_module():
    """Leaves no gangs or slices of a test module behind for later modules."""
    yield
    import gc

    gc.collect()
    pw._core.await_quiescence()


@pytest.fixture
def jax64():
    """JAX (skipped if absent) with float64 on for the test, and as it was after: other
    modules compare JAX's float32 bits."""
    jax = pytest.importorskip("jax")
    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield jax
    jax.config.update("jax_enable_x64", before)


@pytest.fixture(scope="module")
def tpus2():
    """A 2-TPU slice shared by the tests of one module."""
    return get_devices(2)


@pytest.fixture(scope="module")
def tpus4():
    """A 4-TPU slice shared by the tests of one module."""
    return get_devices(4)


def random_axes(rng, ndim):
    """None, an int (maybe negative) or a tuple of distinct axes."""
    choice = int(rng.integers(0, 3))
    if choice == 0 or ndim == 0:
        return None
    if choice == 1:
        a = int(rng.integers(0, ndim))
        return a - ndim if rng.random() < 0.5 else a
    k = int(rng.integers(0, ndim + 1))
    axes = [int(a) for a in rng.permutation(ndim)[:k]]
    return tuple(a - ndim if rng.random() < 0.5 else a for a in axes)
