"""A one-machine Ceph cluster on loopback, for the S3 tests and the bench: one monitor, one OSD on
memstore (RAM, nothing on disk), and RADOS Gateways (`radosgw`) answering S3 for the test account.

Why Ceph: it is the most widely self-hosted distributed object store, and the one a user who outgrows
moto and s3rver runs their shared store on. Its gateway differs from the mocks where S3 clients break
(listing, ranged GETs, multi-object delete, error bodies, a gateway that waits on a stalled OSD).

The caller owns everything: `CephCluster.start()` brings the monitor and the OSD up in a fresh temporary
directory, `gateway()` starts a radosgw on a free port (several may serve one cluster, as several hosts'
gateways do), `stop()` ends all of them and removes the directory. Every daemon runs in the foreground
as our child in its own session and dies with its parent. Authentication between daemons is off and
messages use crc mode (cephx adds nothing on loopback); the S3 account is `AWS_TEST_ENV`'s key and secret
(unless given others), so a client set up for moto talks to Ceph unchanged. The gateways have a KMS
(Ceph's `testing` backend) and a second storage class, so a tier's `sse: aws:kms` and `storage_class`
work as on AWS, and beast's `tcp_nodelay` (without it every ranged GET waits out a delayed ACK).

Debian packages: ceph-mon, ceph-osd, radosgw (and ceph-common, which they pull in); scripts/_venv.sh
installs them.
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from .child_process import (
    LOOPBACK, answers_http, detach_and_die_with_parent, end_process_group, free_loopback_port, wait_until_silent)
from .s3_server import AWS_TEST_ENV

log = logging.getLogger(__name__)

PACKAGES = ("ceph-mon", "ceph-osd", "radosgw")
BINARIES = ("ceph-mon", "ceph-osd", "radosgw", "radosgw-admin", "ceph", "monmaptool", "ceph-authtool")
ACCESS_KEY, SECRET_KEY = AWS_TEST_ENV["AWS_ACCESS_KEY_ID"], AWS_TEST_ENV["AWS_SECRET_ACCESS_KEY"]
START_TIMEOUT_S = 120.0
# daemons die with us by SIGKILL: an OSD whose monitor is gone ignores SIGTERM for minutes, and memstore
# has nothing to flush
_KILLED_WITH_PARENT = functools.partial(detach_and_die_with_parent, signal.SIGKILL)
# what the gateways are set up for beyond a bare install, so the tier's put options work as on AWS: the
# `testing` KMS backend with one key (sse: aws:kms, sse_kms_key_id: KMS_KEY_ID; plain HTTP allowed), and a
# second storage class in the default placement
KMS_KEY_ID = "alias/lifeboat-test"
STORAGE_CLASSES = ("STANDARD_IA",)

_CONF = """\
[global]
fsid = {fsid}
mon host = v2:{host}:{mon_port}
auth cluster required = none
auth service required = none
auth client required = none
auth allow insecure global id reclaim = true
mon warn on insecure global id reclaim allowed = false
ms bind ipv6 = false
ms bind msgr1 = false
ms mon client mode = crc
ms mon cluster mode = crc
ms mon service mode = crc
ms client mode = crc
ms cluster mode = crc
ms service mode = crc
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon max pg per osd = 1000
mon allow pool size one = true
mon warn on pool no redundancy = false
mon data avail warn = 1
mon data avail crit = 0
run dir = {root}/run
admin socket = {root}/run/$name.asok
log file = {root}/log/$name.log
[mon]
mon data = {root}/mon/$id
[osd]
osd data = {root}/osd/$id
osd objectstore = memstore
memstore device bytes = {memstore_bytes}
osd max object name len = 460
osd max object namespace len = 64
[client]
rgw data = {root}/rgw/$name
rgw crypt require ssl = false
rgw crypt s3 kms backend = testing
rgw crypt s3 kms encryption keys = {kms_key_id}={kms_key}
"""


def missing_binaries() -> list[str]:
    """The Ceph programs this launcher needs that are not on PATH."""
    return [b for b in BINARIES if shutil.which(b) is None]


class CephError(RuntimeError):
    """A daemon did not start, or a setup command failed; the message carries its log's tail."""


class CephCluster:
    """One monitor and one memstore OSD in a temporary directory; `gateway()` adds S3 endpoints."""

    def __init__(self, memstore_bytes: int = 4 << 30, root: str | os.PathLike | None = None, *,
                 access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY) -> None:
        self.root = Path(root or tempfile.mkdtemp(prefix="lifeboat-ceph-"))
        self.access_key, self.secret_key = access_key, secret_key
        self.memstore_bytes = memstore_bytes
        self.mon_port = free_loopback_port()
        self.conf = self.root / "ceph.conf"
        self.env = {**os.environ, "CEPH_CONF": str(self.conf)}
        self._daemons: dict[str, subprocess.Popen] = {}
        self.gateways: list[Gateway] = []
        self.start_seconds = 0.0  # monitor + OSD up, the first gateway answering, the account made
        self._account = False

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout: float = START_TIMEOUT_S) -> "CephCluster":
        """Monitor, OSD, and a first gateway with the test account (pools are made on its first start)."""
        t0 = time.monotonic()
        absent = missing_binaries()
        if absent:
            raise CephError(f"Ceph is not installed (missing {', '.join(absent)}): apt-get install -y "
                            f"{' '.join(PACKAGES)} (scripts/_venv.sh does this as root)")
        for sub in ("run", "log", "mon", "osd/0", "rgw"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        fsid = str(uuid.uuid4())
        self.conf.write_text(_CONF.format(fsid=fsid, host=LOOPBACK, mon_port=self.mon_port, root=self.root,
                                          memstore_bytes=self.memstore_bytes, kms_key_id=KMS_KEY_ID,
                                          kms_key=base64.b64encode(os.urandom(32)).decode()))
        try:
            self._run("monmaptool", "--create", "--addv", "a", f"[v2:{LOOPBACK}:{self.mon_port}]", "--fsid", fsid,
                      str(self.root / "monmap"))
            self._run("ceph-authtool", "--create-keyring", str(self.root / "mon.keyring"), "--gen-key", "-n",
                      "mon.", "--cap", "mon", "allow *")
            self._run("ceph-mon", "--mkfs", "-i", "a", "--monmap", str(self.root / "monmap"), "--keyring",
                      str(self.root / "mon.keyring"))
            self._daemon("mon.a", "ceph-mon", "-f", "-i", "a")
            osd_id = self._run("ceph", "osd", "create", timeout=timeout).strip()
            self._run("ceph-osd", "-i", osd_id, "--mkfs")
            self._daemon("osd.0", "ceph-osd", "-f", "-i", osd_id)
            self._wait(lambda: json.loads(self._run("ceph", "osd", "stat", "-f", "json"))["num_up_osds"] == 1,
                       t0 + timeout, "osd.0")
            self.gateway(timeout=max(1.0, t0 + timeout - time.monotonic()))
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0
        log.info("ceph up in %.1f s (%s)", self.start_seconds, self.root)
        return self

    def gateway(self, timeout: float = START_TIMEOUT_S) -> "Gateway":
        """A new radosgw on a free port, started, serving the test account."""
        gw = Gateway(self, f"client.rgw.{len(self.gateways)}")
        self.gateways.append(gw)
        gw.start(timeout)
        if not self._account:  # the first gateway made the zone and its pools
            self._run("radosgw-admin", "user", "create", "--uid=lifeboat", "--display-name=lifeboat",
                      f"--access-key={self.access_key}", f"--secret={self.secret_key}")
            for sc in STORAGE_CLASSES:
                self._run("radosgw-admin", "zonegroup", "placement", "add", "--rgw-zonegroup", "default",
                          "--placement-id", "default-placement", "--storage-class", sc)
                self._run("radosgw-admin", "zone", "placement", "add", "--rgw-zone", "default", "--placement-id",
                          "default-placement", "--storage-class", sc, "--data-pool", "default.rgw.buckets.data")
            self._account = True
            gw.restart()  # a gateway reads the placement at start
        return gw

    def pause_osd(self) -> None:
        """SIGSTOP the OSD: every gateway request that reaches RADOS hangs until `resume_osd()`."""
        os.killpg(self._daemons["osd.0"].pid, signal.SIGSTOP)

    def resume_osd(self) -> None:
        os.killpg(self._daemons["osd.0"].pid, signal.SIGCONT)

    def stop(self) -> None:
        """End every gateway and daemon, then remove the directory (memstore data goes with the OSD)."""
        for gw in self.gateways:
            gw.stop(hard=True)
        for name in ("osd.0", "mon.a"):
            proc = self._daemons.pop(name, None)
            if proc is not None:  # killed: memstore has nothing to flush, and an OSD without its monitor hangs
                end_process_group(proc, hard=True, timeout=20.0)
        shutil.rmtree(self.root, ignore_errors=True)

    # ------------------------------------------------------------------ helpers
    def _run(self, *cmd: str, timeout: float = 60.0) -> str:
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=timeout,
                               stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as e:
            raise CephError(f"{' '.join(cmd)}: no answer in {timeout:.0f} s{self._tails()}") from e
        if p.returncode != 0:
            raise CephError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr[-2000:]}{self._tails()}")
        return p.stdout

    def _daemon(self, name: str, *cmd: str) -> subprocess.Popen:
        out = open(self.root / "log" / f"{name}.out", "wb")
        with out:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    env=self.env, preexec_fn=_KILLED_WITH_PARENT)
        self._daemons[name] = proc
        return proc

    def _wait(self, ready, deadline: float, name: str) -> None:  # type: ignore[no-untyped-def]
        while time.monotonic() < deadline:
            for n, proc in self._daemons.items():
                if proc.poll() is not None:
                    raise CephError(f"{n} exited ({proc.returncode}){self._tails()}")
            try:
                if ready():
                    return
            except (CephError, ValueError, KeyError):
                pass
            time.sleep(0.2)
        raise CephError(f"{name} was not up in time{self._tails()}")

    def _tails(self) -> str:
        out = []
        for p in sorted((self.root / "log").glob("*")):
            try:
                out.append(f"\n--- {p.name}:\n{p.read_text(errors='replace')[-1500:]}")
            except OSError:
                continue
        return "".join(out)


class Gateway:
    """One radosgw of a cluster, with the launchers' surface: `endpoint`, `start`, `stop(hard)`,
    `restart`, `pause` / `resume`. The data lives in the cluster, so a restarted gateway serves it again."""

    keeps_data = True  # a restarted gateway serves the cluster's objects again

    def __init__(self, cluster: CephCluster, name: str) -> None:
        self.cluster, self.name = cluster, name
        self.port = free_loopback_port()
        self._proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = START_TIMEOUT_S) -> "Gateway":
        if self.running:
            return self
        c = self.cluster
        self._proc = c._daemon(self.name, "radosgw", "-f", "-n", self.name,
                               "--rgw-frontends", f"beast endpoint={LOOPBACK}:{self.port} tcp_nodelay=1")
        c._wait(lambda: answers_http(self.endpoint + "/"), time.monotonic() + timeout, self.name)
        return self

    def stop(self, hard: bool = False) -> None:
        proc, self._proc = self._proc, None
        self.cluster._daemons.pop(self.name, None)
        if proc is not None:
            end_process_group(proc, hard, timeout=20.0)
        wait_until_silent(self.endpoint + "/", timeout=10.0)

    def restart(self) -> "Gateway":
        self.stop()
        return self.start()

    def pause(self) -> None:
        """SIGSTOP: the gateway hangs (the kernel accepts connections, nothing answers)."""
        if self._proc is not None:
            os.killpg(self._proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self._proc is not None:
            os.killpg(self._proc.pid, signal.SIGCONT)

    def __repr__(self) -> str:
        return f"Gateway({self.name}, {self.endpoint}, running={self.running})"
