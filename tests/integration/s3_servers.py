"""More real servers on loopback for the S3 fault tests (moto's launcher is lifeboat_cache.testing.s3_server).

* `S3rver`: the npm package `s3rver` run with Node: a second, independent S3 implementation that
  checks SigV4 signatures (moto does not) and stores objects as files, so an overwrite in progress is
  listed before its body is complete. Installed by scripts/_venv.sh into `<venv>/node`.
* `Blackhole`: a TCP server that accepts connections and never answers (a hung S3 endpoint).
* `RefusingProxy`: forwards HTTP to another server but answers `501 NotImplemented` to the requests
  a predicate picks (e.g. DeleteObjects, which ONTAP S3 before 9.11.1 refuses).
"""

from __future__ import annotations

import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable

import pytest

from lifeboat_cache.testing.child_process import free_loopback_port

REPO = Path(__file__).resolve().parents[2]
S3RVER_VERSION = "3.7.1"  # pinned; scripts/_venv.sh installs exactly this
S3RVER_KEY = S3RVER_SECRET = "S3RVER"  # s3rver's only account


def s3rver_bin() -> Path | None:
    """The s3rver launcher: $LIFEBOAT_S3RVER, else <venv>/node/..., else <repo>/.venv/node/..."""
    cands = [os.environ.get("LIFEBOAT_S3RVER", "")]
    for root in (Path(sys.prefix), REPO / ".venv"):
        cands.append(str(root / "node" / "node_modules" / ".bin" / "s3rver"))
    for c in cands:
        if c and Path(c).is_file() and shutil.which("node"):
            return Path(c)
    return None


def require_s3rver() -> Path:
    path = s3rver_bin()
    if path is None:
        msg = (f"s3rver {S3RVER_VERSION} (npm) is not installed: run `source scripts/_venv.sh` (it runs "
               f"`npm install --prefix <venv>/node s3rver@{S3RVER_VERSION}`; needs node and npm: "
               f"apt-get install -y nodejs npm) or set LIFEBOAT_S3RVER")
        if os.environ.get("CI", "").strip().lower() in ("true", "1", "yes"):
            pytest.fail(msg)
        pytest.skip(msg)
    return path


class S3rver:
    """`s3rver -d DIR -a 127.0.0.1 -p PORT` in a subprocess; TLS when given a cert and key."""

    def __init__(self, binary: Path, *, cert: Path | None = None, key: Path | None = None) -> None:
        self.binary, self.cert, self.key = binary, cert, key
        self.port = free_loopback_port()
        self.dir = Path(tempfile.mkdtemp(prefix="lifeboat-s3rver-"))
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"{'https' if self.cert else 'http'}://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> "S3rver":
        cmd = [str(self.binary), "-d", str(self.dir / "data"), "-a", "127.0.0.1", "-p", str(self.port), "-s"]
        if self.cert and self.key:
            cmd += ["--cert", str(self.cert), "--key", str(self.key)]
        log = open(self.dir / "s3rver.log", "wb")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"s3rver did not start: {(self.dir / 's3rver.log').read_text(errors='replace')[-2000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)


class Blackhole:
    """Accepts TCP connections on loopback and never answers (until closed)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(512)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self._stop = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.conns.append(conn)  # held open, never read from, never answered

    def close(self) -> None:
        self._stop = True
        self._thread.join(timeout=2)
        for c in self.conns:
            c.close()
        self.sock.close()


class RefusingProxy:
    """HTTP proxy to `upstream` (host, port) that answers 501 NotImplemented when refuse(method, path)."""

    def __init__(self, upstream_port: int, refuse: Callable[[str, str], bool]) -> None:
        self.refused = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: object) -> None:
                pass

            def _any(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if refuse(self.command, self.path):
                    proxy.refused += 1
                    err = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>NotImplemented</Code>'
                           b"<Message>A header you provided implies functionality that is not implemented"
                           b"</Message></Error>")
                    self.send_response(501)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(err)))
                    self.end_headers()
                    self.wfile.write(err)
                    return
                up = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection",)}
                up.request(self.command, self.path, body=body, headers=headers)
                resp = up.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                up.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
