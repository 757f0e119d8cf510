"""A real SGLang 0.5.23 server (`python -m sglang.launch_server`) on this machine's CPU, driven over HTTP.

Why: the restart test, the server bench and `scripts/serve_demo.sh` all need what a user does: launch
SGLang with LifeboatCache as its HiCache L3 backend exactly as docs/sglang.md says, send requests,
read `/metrics`, stop it (SIGTERM) or crash it (SIGKILL of every process), start it again on the same
store. The server runs in its own session (killed with the caller if the caller dies), logs to a file,
and every wait has a deadline and names the log on failure.

CPU flags (docs/sglang.md, "A CPU server"): `--device cpu --attention-backend torch_native
--disable-cuda-graph --skip-server-warmup`; the plugin declares the only HiCache layout SGLang can copy
with off CUDA (layer_first / direct) and closes SGLang's CPU gaps (`integrations/launch/cpu.py`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from ..integrations.launch import BACKEND_EXTRA_CONFIG
from .child_process import LOOPBACK, detach_and_die_with_parent, free_loopback_port

log = logging.getLogger(__name__)

#: SGLang's `file` backend reads its directory from this variable first.
FILE_BACKEND_DIR_ENV = "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"
START_TIMEOUT_S = 300.0
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy
_METRIC_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
_POLL_LINE = re.compile(r'"GET /(metrics|health) HTTP')
_PORT_TAKEN = re.compile(r"address already in use", re.IGNORECASE)  # uvicorn's bind error: it then exits 3
PORT_ATTEMPTS = 3


class ServerFailed(RuntimeError):
    """The server exited, or did not answer in time; the message ends with the tail of its log."""


def cpu_flags(model_dir: Path | str, *, dtype: str = "float32", max_total_tokens: int = 20480,
              page_size: int = 64) -> list[str]:
    """The launch flags of SGLang's CPU path (no HiCache yet).

    float32 by default: in bf16 even SGLang's own device prefix cache changes greedy tokens on CPU (a
    prefill with a cached prefix rounds differently from a full one), so exact token comparisons
    between a cold and a restored request need fp32.
    """
    return ["--model-path", str(model_dir), "--device", "cpu", "--attention-backend", "torch_native",
            "--disable-cuda-graph", "--dtype", dtype, "--max-total-tokens", str(max_total_tokens),
            "--page-size", str(page_size), "--skip-server-warmup", "--enable-metrics"]


def hicache_flags(backend: str, extra_config: Optional[Mapping[str, Any]] = None, *, host_gb: Optional[int] = 1,
                  host_ratio: Optional[float] = None) -> list[str]:
    """`--enable-hierarchical-cache` with `backend` (`lifeboat`: the `dynamic` launch of docs/sglang.md).

    The host pool is `host_gb` GB, or `host_ratio` times the device pool when given (a pool smaller than
    1 GB, which `--hicache-size` cannot say); neither: no size flag (SGLang's default, or what the
    LifeboatCache plugin sets, e.g. from LIFEBOAT_SGLANG_HOST_GB). `backend` "none": host memory only,
    no storage backend."""
    size = (["--hicache-ratio", str(host_ratio)] if host_ratio else
            ["--hicache-size", str(host_gb)] if host_gb else [])
    flags = ["--enable-hierarchical-cache", *size]
    if backend == "none":
        return flags
    if backend == "lifeboat":
        config = {**BACKEND_EXTRA_CONFIG, **(extra_config or {})}
        return flags + ["--hicache-storage-backend", "dynamic",
                        "--hicache-storage-backend-extra-config", json.dumps(config)]
    flags += ["--hicache-storage-backend", backend]
    if extra_config:
        flags += ["--hicache-storage-backend-extra-config", json.dumps(dict(extra_config))]
    return flags


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Prometheus text format -> (name, labels, value) samples (comments skipped)."""
    samples = []
    for line in text.splitlines():
        m = _METRIC_LINE.match(line.strip())
        if not m or line.startswith("#"):
            continue
        labels = dict(_LABEL.findall(m.group(2) or ""))
        try:
            samples.append((m.group(1), labels, float(m.group(3))))
        except ValueError:
            continue
    return samples


@dataclass
class Reply:
    """One `/generate` answer: the tokens, what SGLang says it reused, and the wall time."""

    output_ids: list[int]
    prompt_tokens: int
    cached_tokens: int
    cached_details: dict[str, Any]
    seconds: float
    raw: dict[str, Any] = field(repr=False, default_factory=dict)

    @property
    def storage_tokens(self) -> int:
        """Prompt tokens SGLang took from the L3 storage backend (after a restart: from disk)."""
        return int((self.cached_details or {}).get("storage", 0) or 0)


class SGLangServer:
    """One `python -m sglang.launch_server` process tree on 127.0.0.1 (see module doc)."""

    def __init__(self, flags: Sequence[str], *, log_path: Path, env: Optional[Mapping[str, str]] = None,
                 port: Optional[int] = None, python: str = sys.executable) -> None:
        self._own_port = port is None
        self.port = port or free_loopback_port()
        self.flags = list(flags)
        self.log_path = Path(log_path)
        self.env = {**os.environ, **(env or {})}
        self.env.setdefault("PYTHONUNBUFFERED", "1")
        self.python = python
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self._log_offset = 0
        self.started_s: Optional[float] = None
        self.ready_s: Optional[float] = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def command(self) -> list[str]:
        return [self.python, "-m", "sglang.launch_server", *self.flags, "--host", LOOPBACK, "--port", str(self.port)]

    # ----------------------------------------------------------------------------------- lifecycle

    def start(self, timeout: float = START_TIMEOUT_S) -> "SGLangServer":
        """Launch and wait until `/health` answers 200; raises ServerFailed (with the log) otherwise.

        A port we chose ourselves that someone else bound first (SGLang binds it only after the model
        loads) is replaced by a new one and the launch retried, up to PORT_ATTEMPTS times."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        for attempt in range(1, PORT_ATTEMPTS + 1):
            self._launch()
            try:
                self.wait_ready(timeout)
                return self
            except ServerFailed:
                self.kill()
                taken = _PORT_TAKEN.search(self._launch_log())
                if not (taken and self._own_port and attempt < PORT_ATTEMPTS):
                    raise
                log.warning("SGLang could not bind port %d (taken by another process); relaunching on another",
                            self.port)
                self.port = free_loopback_port()
            except BaseException:
                self.kill()
                raise
        raise AssertionError("unreachable: the last attempt raises")

    def _launch(self) -> None:
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as out:
            out.write(f"\n==== {' '.join(self.command())}\n".encode())
            out.flush()
            self.started_s = time.monotonic()
            self.proc = subprocess.Popen(self.command(), stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                         preexec_fn=detach_and_die_with_parent)

    def _launch_log(self) -> str:
        """What the current launch has logged so far."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def wait_ready(self, timeout: float) -> float:
        """Seconds from start until `/health` answered 200 (ServerFailed if it exits or times out).

        Only once uvicorn logged that it listens on our port: until then whatever answers there is another
        process's."""
        deadline = time.monotonic() + timeout
        listening = f"running on {self.url}"
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise ServerFailed(f"SGLang exited with {self.proc.returncode} before it was ready\n{self.log_tail()}")
            if listening not in self._launch_log():
                time.sleep(0.25)
                continue
            try:
                with _DIRECT.open(self.url + "/health", timeout=2.0) as resp:
                    if resp.status == 200:
                        self.ready_s = time.monotonic() - (self.started_s or time.monotonic())
                        return self.ready_s
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.25)
        raise ServerFailed(f"SGLang did not answer /health within {timeout:.0f} s\n{self.log_tail()}")

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM to the launcher, as a service manager does; waits, then SIGKILLs what is left."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("SGLang did not stop within %.0f s of SIGTERM; killing it", timeout)
        self._kill_group()
        return int(self.proc.returncode if self.proc.returncode is not None else -9)

    def kill(self) -> None:
        """SIGKILL every process of the server at once: a crash, nothing gets to clean up."""
        self._kill_group()

    def _kill_group(self) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            log.warning("SGLang launcher %d still there after SIGKILL", self.proc.pid)
        # The process group is gone only when every member is: wait for the schedulers too.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _group_alive(self.proc.pid):
            time.sleep(0.1)

    def __enter__(self) -> "SGLangServer":
        return self if self.running() else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tail(self, lines: int = 40) -> str:
        """The log's last lines, without the access lines of our own /metrics and /health polling."""
        try:
            text = [line for line in self.log_path.read_text(errors="replace").splitlines()
                    if not _POLL_LINE.search(line) and "server_args=" not in line]
        except OSError:
            return f"(no log at {self.log_path})"
        return f"--- last {lines} lines of {self.log_path}:\n" + "\n".join(text[-lines:])

    # -------------------------------------------------------------------------------------- HTTP

    def _post(self, path: str, body: Mapping[str, Any], timeout: float) -> dict[str, Any]:
        req = urllib.request.Request(self.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        try:
            with _DIRECT.open(req, timeout=timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as e:
            raise ServerFailed(f"{path} answered {e.code}: {e.read()[:500]!r}\n{self.log_tail()}") from e
        except (urllib.error.URLError, OSError) as e:
            raise ServerFailed(f"{path} failed: {e}\n{self.log_tail()}") from e

    def generate(self, input_ids: Sequence[int], max_new_tokens: int = 8, timeout: float = 600.0) -> Reply:
        """Greedy `/generate` on token ids (so prompt lengths are exact); returns tokens and cache facts."""
        body = {"input_ids": list(input_ids),
                "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True}}
        started = time.perf_counter()
        out = self._post("/generate", body, timeout)
        seconds = time.perf_counter() - started
        meta = out.get("meta_info", {})
        return Reply(output_ids=list(out.get("output_ids", [])), prompt_tokens=int(meta.get("prompt_tokens", 0)),
                     cached_tokens=int(meta.get("cached_tokens", 0)),
                     cached_details=dict(meta.get("cached_tokens_details") or {}), seconds=seconds, raw=out)

    def metrics_text(self, timeout: float = 10.0) -> str:
        try:
            with _DIRECT.open(self.url + "/metrics", timeout=timeout) as resp:
                return resp.read().decode()
        except (urllib.error.URLError, OSError) as e:
            raise ServerFailed(f"/metrics failed: {e}\n{self.log_tail()}") from e

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples named `name` whose labels include `labels` (0 when none)."""
        return sum(v for n, lab, v in parse_metrics(self.metrics_text())
                   if n == name and all(lab.get(k) == want for k, want in labels.items()))

    def wait_metric(self, name: str, at_least: float, *, timeout: float = 120.0, settle_s: float = 0.0,
                    **labels: str) -> float:
        """Wait until `name` reaches `at_least` and then holds still for `settle_s`; returns its value.

        The observable end of SGLang's background backups: `lifeboat_pages_written_total` stops growing.
        """
        deadline = time.monotonic() + timeout
        last, since = None, time.monotonic()
        while time.monotonic() < deadline:
            value = self.metric(name, **labels)
            if value != last:
                last, since = value, time.monotonic()
            if value >= at_least and time.monotonic() - since >= settle_s:
                return value
            time.sleep(0.2)
        raise ServerFailed(f"{name}{labels or ''} was {last}, not >= {at_least} within {timeout:.0f} s\n"
                           f"{self.log_tail()}")


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def prompt_ids(model_dir: Path | str, tokens: int, *, salt: str = "") -> list[int]:
    """`tokens` token ids of readable text (the demo's documents, numbered and repeated), salted per test.

    Token ids rather than text so that prompt lengths, and so whole pages, are exact.
    """
    from tokenizers import Tokenizer

    from ..demo import DECLARATION, GETTYSBURG

    tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    ids: list[int] = tok.encode(f"{salt}\n").ids if salt else []
    part = 0
    while len(ids) < tokens:
        part += 1
        doc = DECLARATION if part % 2 else GETTYSBURG
        ids += tok.encode(f"\n\nPart {part}.\n{doc}").ids
    return ids[:tokens]
