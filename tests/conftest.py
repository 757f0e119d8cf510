"""Shared pytest plumbing for LifeboatCache.

* Under ``CI=true`` a skipped test (or a module skipped at collection, e.g. by
  ``pytest.importorskip``) fails the session, so a missing install step cannot hide behind a skip.
  ``xfail`` is not a skip and is not counted.
* ``s3_endpoint`` (session) / ``s3_server`` (per test): every S3 test runs twice, on moto's standalone
  S3 server (``[moto]``: a real HTTP server in a subprocess on 127.0.0.1, state in memory, a restart
  starts empty) and on a Ceph RADOS Gateway (``[ceph]``: one cluster per session, a monitor and a
  memstore OSD, lifeboat_cache/testing/ceph_rgw.py; ``s3_server`` is a gateway of its own, whose restart
  serves the cluster's data again). Without Ceph installed the ``[ceph]`` cases skip (under CI: fail).
* ``blas_env``: an environment for child processes with OpenBLAS preloaded for MLX on Linux CPU.
* Dummy AWS credentials for the whole session, and no route to any non-loopback AWS endpoint
  (instance metadata disabled, shared config/credential files ignored).
* The session's long-lived heap (torch, SGLang, MLX and pytest's own objects) is frozen out of Python's
  cyclic GC before each test module, as SGLang's servers do after warm-up (`freeze_gc`): unfrozen, one
  full collection of this process's ~800k objects stopped every thread for 0.6-1.5 s on the 2-vCPU
  VM, in the middle of tests that time what they measure (a read of a held filer "within 1.5 s").
  The store's own deadlines stand still during a collection (store/gc_pauses.py, tested in
  tests/unit/store/test_runs.py).
"""

from __future__ import annotations

import gc
import logging
import os
import subprocess
from pathlib import Path

import pytest

from lifeboat_cache.testing.s3_server import AWS_TEST_ENV, MotoS3Server, start_with_retry  # noqa: F401  (one launcher)

log = logging.getLogger("lifeboat.tests")

LOOPBACK = "127.0.0.1"

_AWS_TEST_ENV = AWS_TEST_ENV
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


@pytest.fixture(scope="module", autouse=True)
def _frozen_heap() -> None:
    """Collect what the last module left, then freeze the survivors (see the module docstring)."""
    gc.collect()
    gc.freeze()


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
# (b) S3 servers on loopback: moto and a Ceph RADOS Gateway
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def _moto_log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("moto")


S3_SERVERS = ("moto", "ceph")


CEPH_START_S = pytest.StashKey[float]()


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # type: ignore[no-untyped-def]
    if CEPH_START_S in config.stash:
        terminalreporter.write_line(f"ceph: monitor, memstore OSD, gateway and account up in "
                                    f"{config.stash[CEPH_START_S]:.1f} s (once per session)")


@pytest.fixture(scope="session")
def ceph(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config):
    """The session's Ceph cluster with one gateway; its start time is in the run's summary."""
    from lifeboat_cache.testing import CephCluster, missing_binaries
    from lifeboat_cache.testing.ceph_rgw import PACKAGES

    absent = missing_binaries()
    if absent:
        pytest.skip(f"Ceph is not installed (missing {', '.join(absent)}): source scripts/_venv.sh as root, "
                    f"or apt-get install -y {' '.join(PACKAGES)}")
    cluster = CephCluster(root=tmp_path_factory.mktemp("ceph")).start()
    pytestconfig.stash[CEPH_START_S] = cluster.start_seconds
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session", params=S3_SERVERS)
def s3_endpoint(request: pytest.FixtureRequest, _moto_log_dir: Path):
    """``"http://127.0.0.1:PORT"`` of an S3 server shared by the whole session (moto, then Ceph's gateway).

    Shared state: use unique bucket names per test. Do not stop this one; use ``s3_server``.
    """
    if request.param == "ceph":
        yield request.getfixturevalue("ceph").gateways[0].endpoint
        return
    server = start_with_retry(_moto_log_dir)
    try:
        yield server.endpoint
    finally:
        server.stop()


@pytest.fixture
def s3_kind(request: pytest.FixtureRequest) -> str:
    """Which server this test's ``s3_endpoint`` / ``s3_server`` is: "moto" or "ceph"."""
    params = request.node.callspec.params
    return str(params.get("s3_endpoint", params.get("s3_server")))


@pytest.fixture(params=S3_SERVERS)
def s3_server(request: pytest.FixtureRequest, _moto_log_dir: Path):
    """A dedicated S3 server for one test, with ``.endpoint``, ``.stop(hard=False)``, ``.start()`` (same
    port), ``.restart()``, ``.pause()`` / ``.resume()``. Always stopped at teardown."""
    server = request.getfixturevalue("ceph").gateway() if request.param == "ceph" else start_with_retry(_moto_log_dir)
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
    lives in one place, ``lifeboat_cache.demo.mlx_serving.child_env`` (the demo uses it too).
    """
    from lifeboat_cache.demo.mlx_serving import child_env

    env = child_env(dict(os.environ))
    if "LIFEBOAT_BLAS_PRELOAD" not in env:
        log.info("OpenBLAS libblas.so.3 not found; MLX children run with the wheel's reference BLAS")
    return env


# --------------------------------------------------------------------------------------------
# (d) A real small file system for full-disk tests (root: tmpfs mounts)
# --------------------------------------------------------------------------------------------


@pytest.fixture
def tmpfs_mount(tmp_path: Path):
    """``mount(size)`` -> a fresh tmpfs of that size (e.g. "1m") under tmp_path, unmounted afterwards."""
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        mnt = tmp_path / f"tmpfs-{len(mounted)}"
        mnt.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], check=True)
        mounted.append(mnt)
        return mnt

    yield mount
    for mnt in mounted:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
