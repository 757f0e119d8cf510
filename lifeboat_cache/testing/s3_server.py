"""moto's standalone S3 server on loopback, started and stopped from Python: the one launcher.

Used by the ``s3_endpoint`` / ``s3_server`` fixtures (tests/conftest.py) and by the benchmark's S3
sections (bench/s3.py, bench/s3_rebuild.py), which add a fixed per-request latency (``latency_ms``)
to model a remote object store. ``python -m lifeboat_cache.testing.s3_server --serve PORT
--latency-ms MS`` is the delayed server itself. Needs moto (a test / bench dependency), imported in
the server child only.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .child_process import (
    LOOPBACK, answers_http, detach_and_die_with_parent, end_process_group, free_loopback_port, wait_until_silent)

log = logging.getLogger(__name__)

_SERVER_START_TIMEOUT_S = 60.0
AWS_TEST_ENV = {
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


class MotoS3Server:
    """moto's standalone server (``python -m moto.server``) in a subprocess on 127.0.0.1.

    ``stop()`` terminates it (``hard=True``: SIGKILL, like a crash); ``start()`` brings it back on
    the same port, so a client configured with ``endpoint`` keeps working. moto keeps buckets and
    objects in memory: after a restart the server is empty (recreate the bucket).
    """

    keeps_data = False  # a restarted server is empty

    def __init__(self, port: int | None = None, log_dir: str | os.PathLike | None = None,
                 latency_ms: float = 0.0) -> None:
        self.port = port or free_loopback_port()
        self.latency_ms = latency_ms
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
        if self.latency_ms > 0:  # moto's app behind a fixed per-request delay (benchmarks)
            return [sys.executable, "-m", __name__, "--serve", str(self.port), "--latency-ms", str(self.latency_ms)]
        return [sys.executable, "-m", "moto.server", "-H", self.host, "-p", str(self.port)]

    def start(self, timeout: float = _SERVER_START_TIMEOUT_S) -> "MotoS3Server":
        if self.running:
            return self
        self._starts += 1
        log_path = self._log_dir / f"moto-{self.port}-{self._starts}.log"
        env = dict(os.environ)
        env.update(AWS_TEST_ENV)
        deadline = time.monotonic() + timeout
        with open(log_path, "wb") as log_file:
            self._proc = subprocess.Popen(
                self._command(),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                preexec_fn=detach_and_die_with_parent,
            )
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                break
            if answers_http(self.endpoint + "/moto-api/"):
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
        end_process_group(proc, hard, timeout)
        wait_until_silent(self.endpoint + "/moto-api/", timeout)

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


def start_with_retry(log_dir: str | os.PathLike | None = None, attempts: int = 3,
                     latency_ms: float = 0.0) -> MotoS3Server:
    """A started server on a fresh port, retrying when the port was taken between probe and bind."""
    last: Exception | None = None
    for _ in range(attempts):
        server = MotoS3Server(log_dir=log_dir, latency_ms=latency_ms)
        try:
            return server.start()
        except RuntimeError as exc:  # e.g. the free port was taken between probe and bind
            last = exc
            log.warning("moto start failed on port %d, retrying: %s", server.port, exc)
    raise RuntimeError(f"could not start moto server after {attempts} attempts") from last


def serve(port: int, latency_ms: float) -> None:
    """Run moto's S3 app on 127.0.0.1:port, sleeping latency_ms before each request."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    app = DomainDispatcherApplication(create_backend_app)
    delay = latency_ms / 1000.0

    def delayed(environ, start_response):  # type: ignore[no-untyped-def]
        if delay:
            time.sleep(delay)
        return app(environ, start_response)

    make_server(LOOPBACK, port, delayed, threaded=True, request_handler=MotoRequestHandler).serve_forever()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--serve", type=int, required=True)
    ap.add_argument("--latency-ms", type=float, default=0.0)
    a = ap.parse_args()
    serve(a.serve, a.latency_ms)
