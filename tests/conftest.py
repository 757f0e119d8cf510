"""Shared pytest plumbing for LifeboatCache.

* Under ``CI=true`` a skipped test (or a module skipped at collection, e.g. by
  ``pytest.importorskip``) fails the session, so a missing install step cannot hide behind a skip.
  ``xfail`` is not a skip and is not counted.
* ``s3_endpoint`` (session) / ``s3_server`` (per test): moto's standalone S3 server, a real HTTP
  server in a subprocess bound to 127.0.0.1 only. Its state is in memory: a restart starts empty.
* ``blas_env``: an environment for child processes with OpenBLAS preloaded for MLX on Linux CPU.
* Dummy AWS credentials for the whole session, and no route to any non-loopback AWS endpoint
  (instance metadata disabled, shared config/credential files ignored).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

log = logging.getLogger("lifeboat.tests")

LOOPBACK = "127.0.0.1"
_SERVER_START_TIMEOUT_S = 60.0

_AWS_TEST_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_SECURITY_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    # Never let botocore look for credentials on the network (169.254.169.254) or in ~/.aws.
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
}
_AWS_UNSET = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


# --------------------------------------------------------------------------------------------
# Session-wide environment
# --------------------------------------------------------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    # Set before collection so module-level boto3 clients also see the dummy credentials.
    os.environ.update(_AWS_TEST_ENV)
    for name in _AWS_UNSET:
        os.environ.pop(name, None)
    # Loopback traffic must never go through a proxy.
    for name in ("NO_PROXY", "no_proxy"):
        current = [p for p in os.environ.get(name, "").split(",") if p]
        for host in (LOOPBACK, "localhost"):
            if host not in current:
                current.append(host)
        os.environ[name] = ",".join(current)
    config.pluginmanager.register(SkipGuard(), "lifeboat-skip-guard")


# --------------------------------------------------------------------------------------------
# (a) CI=true: skips fail the run
# --------------------------------------------------------------------------------------------


class SkipGuard:
    """Records every skip (test phase or collection); under CI=true, any skip fails the session."""

    def __init__(self) -> None:
        self.skips: list[tuple[str, str]] = []

    @staticmethod
    def _reason(report: pytest.TestReport | pytest.CollectReport) -> str:
        longrepr = report.longrepr
        if isinstance(longrepr, tuple) and len(longrepr) == 3:  # (path, lineno, "Skipped: why")
            return str(longrepr[2])
        return str(longrepr)

    def _record(self, report: pytest.TestReport | pytest.CollectReport) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):
            self.skips.append((report.nodeid, self._reason(report)))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._record(report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self._record(report)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if _in_ci() and self.skips and session.exitstatus in (
            pytest.ExitCode.OK,
            pytest.ExitCode.NO_TESTS_COLLECTED,
        ):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter, exitstatus: int, config: pytest.Config) -> None:
        if not (_in_ci() and self.skips):
            return
        terminalreporter.section("CI=true: skipped tests fail the run", sep="=", red=True, bold=True)
        for nodeid, reason in self.skips:
            terminalreporter.write_line(f"SKIPPED (counts as failure) {nodeid}: {reason}", red=True)
            log.error("CI=true and test skipped: %s: %s", nodeid, reason)
        terminalreporter.write_line(
            f"{len(self.skips)} skip(s) under CI=true: a dependency or install step is missing.",
            red=True,
        )


# --------------------------------------------------------------------------------------------
# (b) moto standalone S3 server on loopback
# --------------------------------------------------------------------------------------------


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


# An opener that ignores *_PROXY variables: the probe must go straight to 127.0.0.1.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _answers_http(url: str) -> bool:
    try:
        with _DIRECT.open(url, timeout=1.0) as resp:
            resp.read(0)
        return True
    except urllib.error.HTTPError:
        return True  # any HTTP status means the server is up
    except (urllib.error.URLError, OSError):
        return False


def _detach_and_die_with_parent() -> None:
    """Child pre-exec: own session (a Ctrl-C to pytest does not race our shutdown), and on Linux
    SIGTERM when pytest dies, so a killed test run never leaves a server behind."""
    os.setsid()
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)


class MotoS3Server:
    """moto's standalone server (``python -m moto.server``) in a subprocess on 127.0.0.1.

    ``stop()`` terminates it (``hard=True``: SIGKILL, like a crash); ``start()`` brings it back on
    the same port, so a client configured with ``endpoint`` keeps working. moto keeps buckets and
    objects in memory: after a restart the server is empty (recreate the bucket).
    """

    def __init__(self, port: int | None = None, log_dir: str | os.PathLike | None = None) -> None:
        self.port = port or _free_loopback_port()
        self.host = LOOPBACK
        self._log_dir = Path(log_dir or tempfile.mkdtemp(prefix="lifeboat-moto-"))
        self._proc: subprocess.Popen | None = None
        self._starts = 0

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _command(self) -> list[str]:
        return [sys.executable, "-m", "moto.server", "-H", self.host, "-p", str(self.port)]

    def start(self, timeout: float = _SERVER_START_TIMEOUT_S) -> "MotoS3Server":
        if self.running:
            return self
        self._starts += 1
        log_path = self._log_dir / f"moto-{self.port}-{self._starts}.log"
        env = dict(os.environ)
        env.update(_AWS_TEST_ENV)
        deadline = time.monotonic() + timeout
        with open(log_path, "wb") as log_file:
            self._proc = subprocess.Popen(
                self._command(),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                preexec_fn=_detach_and_die_with_parent,
            )
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                break
            if _answers_http(self.endpoint + "/moto-api/"):
                log.info("moto S3 server up at %s (pid %d)", self.endpoint, self._proc.pid)
                return self
            time.sleep(0.1)
        tail = log_path.read_text(errors="replace")[-4000:] if log_path.exists() else ""
        self.stop(hard=True)
        raise RuntimeError(
            f"moto server did not answer on {self.endpoint} within {timeout:.0f}s "
            f"(command: {' '.join(self._command())}); log {log_path}:\n{tail}"
        )

    def stop(self, hard: bool = False, timeout: float = 10.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL if hard else signal.SIGTERM)
            if not hard:
                os.killpg(proc.pid, signal.SIGCONT)  # a paused server must wake up to exit
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            log.warning("moto server pid %d ignored SIGTERM; killing", proc.pid)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=timeout)
        # Wait for the port to stop answering so a test that just stopped it sees an outage.
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and _answers_http(self.endpoint + "/moto-api/"):
            time.sleep(0.05)

    def restart(self) -> "MotoS3Server":
        self.stop()
        return self.start()

    def pause(self) -> None:
        """SIGSTOP: the server hangs (connections accepted by the kernel, no answers) and keeps
        its data, like an unreachable endpoint that comes back. Undo with ``resume()``."""
        if self.running:
            os.killpg(self._proc.pid, signal.SIGSTOP)  # type: ignore[union-attr]

    def resume(self) -> None:
        if self.running:
            os.killpg(self._proc.pid, signal.SIGCONT)  # type: ignore[union-attr]

    def __repr__(self) -> str:
        return f"MotoS3Server({self.endpoint}, running={self.running})"


def _start_with_retry(log_dir: Path, attempts: int = 3) -> MotoS3Server:
    last: Exception | None = None
    for _ in range(attempts):
        server = MotoS3Server(log_dir=log_dir)
        try:
            return server.start()
        except RuntimeError as exc:  # e.g. the free port was taken between probe and bind
            last = exc
            log.warning("moto start failed on port %d, retrying: %s", server.port, exc)
    raise RuntimeError(f"could not start moto server after {attempts} attempts") from last


@pytest.fixture(scope="session")
def _moto_log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("moto")


@pytest.fixture(scope="session")
def s3_endpoint(_moto_log_dir: Path):
    """``"http://127.0.0.1:PORT"`` of a moto S3 server shared by the whole session.

    Shared state: use unique bucket names per test. Do not stop this one; use ``s3_server``.
    """
    server = _start_with_retry(_moto_log_dir)
    try:
        yield server.endpoint
    finally:
        server.stop()


@pytest.fixture
def s3_server(_moto_log_dir: Path):
    """A dedicated moto S3 server for one test, with ``.endpoint``, ``.stop(hard=False)``,
    ``.start()`` (same port) and ``.restart()``. Always stopped at teardown."""
    server = _start_with_retry(_moto_log_dir)
    try:
        yield server
    finally:
        server.stop(hard=True)


# --------------------------------------------------------------------------------------------
# (c) OpenBLAS preload for MLX children on Linux CPU
# --------------------------------------------------------------------------------------------


@pytest.fixture
def blas_env() -> dict[str, str]:
    """``os.environ`` copy for child processes, with LD_PRELOAD = OpenBLAS when it exists.

    MLX's Linux CPU wheel links a reference BLAS (~30x slower fp32 GEMM); preloading Debian's
    OpenBLAS interposes cblas_sgemm. Without the library the env is returned unchanged. The rule
    lives in one place, ``lifeboat_cache.testing.mlx_serving.child_env`` (the demo uses it too).
    """
    from lifeboat_cache.testing.mlx_serving import child_env

    env = child_env(dict(os.environ))
    if "LIFEBOAT_BLAS_PRELOAD" not in env:
        log.info("OpenBLAS libblas.so.3 not found; MLX children run with the wheel's reference BLAS")
    return env
