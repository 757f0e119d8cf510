"""What every server the tests launch needs from its parent: a port to listen on, a pre-exec that ties the
child's life to ours, and a probe of whether it answers HTTP yet. Used by the moto, Ceph, s3rver and SGLang
launchers.

Why the port is chosen below the kernel's ephemeral range: the child binds it only seconds later (SGLang
after loading the model), and until then the port is free, so any socket that asks the kernel for a port
(bind to 0, or an outgoing connect) can be handed it. An SGLang server's own processes open such sockets
while it starts; in one CI run one of them took the HTTP port first and the server exited with "address
already in use". Below the ephemeral range only a process that names the port can take it. SGLang keeps
its own later-bound port (the torch distributed store) in 22000-29999 for the same reason
(`sglang.srt.utils.network.get_free_port_below_ephemeral`), so ours come from a range below that.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
PORT_RANGE = (12000, 21999)  # below SGLang's 22000-29999 and the kernel's ephemeral range (32768+ by default)
_EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"


def ephemeral_port_low() -> int:
    """The first port the kernel hands out on its own (bind to 0, connect)."""
    try:
        with open(_EPHEMERAL_RANGE_FILE) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def free_loopback_port(attempts: int = 64) -> int:
    """A port on 127.0.0.1 that is free now and that the kernel hands to no one who did not name it
    (see the module doc); another process that names it can still take it first, so launchers retry
    on "address already in use"."""
    low, high = PORT_RANGE[0], min(PORT_RANGE[1], ephemeral_port_low() - 1)
    if high - low + 1 >= attempts:
        for port in random.sample(range(low, high + 1), attempts):
            if _bindable(port):
                return port
    # A tuned ephemeral range leaves no room below it: the kernel's choice is the only one left.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def detach_and_die_with_parent(death_signal: int = signal.SIGTERM) -> None:
    """Child pre-exec: own session (a Ctrl-C to pytest does not race our shutdown), and on Linux
    `death_signal` when the parent dies, so a killed test run never leaves a server behind."""
    os.setsid()
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, death_signal, 0, 0, 0)


def end_process_group(proc: subprocess.Popen, hard: bool, timeout: float) -> None:
    """End a launched server's process group: SIGKILL (`hard`, like a crash), or SIGTERM with a SIGCONT
    (a paused server must wake up to exit) and SIGKILL if it is still there after `timeout`."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL if hard else signal.SIGTERM)
        if not hard:
            os.killpg(proc.pid, signal.SIGCONT)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        log.warning("server pid %d ignored SIGTERM; killing", proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=timeout)


def wait_until_silent(url: str, timeout: float) -> None:
    """Wait (up to `timeout`) for a stopped server's port to stop answering, so that a test that just
    stopped it sees an outage."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and answers_http(url):
        time.sleep(0.05)


# An opener that ignores *_PROXY variables: the probe must go straight to 127.0.0.1.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def answers_http(url: str) -> bool:
    """Whether a server answers `url` with any HTTP status (1 s timeout, never through a proxy)."""
    try:
        with _DIRECT.open(url, timeout=1.0) as resp:
            resp.read(0)
        return True
    except urllib.error.HTTPError:
        return True  # any HTTP status means the server is up
    except (urllib.error.URLError, OSError):
        return False
