"""One ``tritonserver`` process: start on free loopback ports (or those asked for), wait until ready,
restart on the same ports, stop without leftovers.

Owns ``TritonServerProcess`` (used by the launcher and by the end-to-end tests), ``TritonListen``
(what was asked for) and ``TritonEndpoints`` (what it got), and the model's health probe over HTTP. The server runs in its own session and process group so that a terminal's
Ctrl-C reaches only the launcher, which then stops the server in order; the group id also lets
``stop()`` find and kill a Python-backend stub that outlives its server. Shared-memory regions
are attributed to this server by the stub command lines (never by timing, because other servers
may run on the same machine) and removed only if the server could not remove them itself.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from openai_frontend.launcher.network import free_port
from openai_frontend.launcher.triton_install import TritonInstall
from openai_frontend.launcher.triton_log import failure_summary, is_noise
from python_backend.protocol.contract import HEALTH_PROBE

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "triton_python_backend_shm_region_"
STUB_NAME = "triton_python_backend_stub"  # the Python backend's per-instance model process
STOP_TIMEOUT_S = 30.0
POLL_INTERVAL_S = 0.25
PROBE_TIMEOUT_S = 2.0


# The header that carries the per-start secret of a restricted server (gRPC keys are lowercase).
SECRET_HEADER = "triton-chat-secret"
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"
# Triton's APIs that act on the server itself: with them a local process could map the stub's
# shared memory (the first step of the published shared-memory exploit chain) or load models.
ADMIN_APIS = ("shared-memory", "model-repository", "trace", "logging")
EVERY_API = ("health", "metadata", "inference", "model-config", "statistics", *ADMIN_APIS)
# tritonserver 2.59 (NGC 25.07) fixed the published shared-memory and HTTP CVEs (August 2025).
FIXED_VERSION = (2, 59)


@dataclass(frozen=True)
class RestrictedAccess:
    """Triton APIs that answer only calls carrying ``SECRET_HEADER`` with this start's secret.

    Triton checks the header itself (``--grpc-restricted-protocol``, ``--http-restricted-api``);
    the launcher's own calls and the frontend's client send it, nothing else knows it.
    """

    apis: tuple[str, ...] = ADMIN_APIS
    secret: str = field(default_factory=lambda: secrets.token_urlsafe(32), repr=False)

    @classmethod
    def for_frontend(cls, api_keys: bool) -> RestrictedAccess:
        """Every API when the frontend needs a key (nothing then works without one), else the
        administrative ones only (a keyless frontend already lets anyone local run inference)."""
        return cls(EVERY_API if api_keys else ADMIN_APIS)

    @property
    def http_headers(self) -> dict[str, str]:
        return {SECRET_HEADER: self.secret}

    @property
    def grpc_headers(self) -> dict[str, str]:
        """Triton's gRPC endpoint expects a restricted protocol's header under its own prefix."""
        return {GRPC_HEADER_PREFIX + SECRET_HEADER: self.secret}

    def flags(self) -> list[str]:
        rule = f"{','.join(self.apis)}:{SECRET_HEADER}={self.secret}"
        return [f"--grpc-restricted-protocol={rule}", f"--http-restricted-api={rule}"]


class TritonServerError(RuntimeError):
    """tritonserver did not start or become ready; the message carries the end of its log."""


@dataclass(frozen=True)
class TritonListen:
    """Where the server's listeners are asked to bind; port 0: a free port chosen at start."""

    grpc_address: str = LOOPBACK
    grpc_port: int = 0
    http_address: str = LOOPBACK
    http_port: int = 0
    metrics_address: str = LOOPBACK
    metrics_port: int = 0

    def endpoints(self) -> TritonEndpoints:
        def port(address: str, wanted: int) -> int:
            return wanted or free_port(LOOPBACK if ":" in address else address)

        return TritonEndpoints(
            LOOPBACK,
            port(self.http_address, self.http_port),
            port(self.grpc_address, self.grpc_port),
            port(self.metrics_address, self.metrics_port),
            http_address=self.http_address,
            grpc_address=self.grpc_address,
            metrics_address=self.metrics_address,
        )


@dataclass(frozen=True)
class TritonEndpoints:
    """Where a started server listens; ``host`` (loopback) is what this machine connects to
    when a listener's address is a wildcard."""

    host: str
    http_port: int
    grpc_port: int
    metrics_port: int
    http_address: str = ""  # the listener's bind address; "": ``host``
    grpc_address: str = ""
    metrics_address: str = ""

    def _reach(self, address: str) -> str:
        """The address to connect to for a listener bound to ``address``."""
        chosen = address or self.host
        if chosen in ("0.0.0.0", "::", "[::]"):
            return self.host
        return f"[{chosen}]" if ":" in chosen and not chosen.startswith("[") else chosen

    @property
    def grpc_url(self) -> str:
        """``host:port``, the form tritonclient.grpc takes."""
        return f"{self._reach(self.grpc_address)}:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://{self._reach(self.http_address)}:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self._reach(self.metrics_address)}:{self.metrics_port}/metrics"


class TritonServerProcess:
    """Start, watch and stop one tritonserver serving one model repository."""

    def __init__(
        self,
        install: TritonInstall,
        log_path: Path,
        extra_args: tuple[str, ...] = (),
        access: RestrictedAccess | None = None,
    ) -> None:
        """``access``: the APIs only callers with its secret may use (None: all open, for tests)."""
        self._install = install
        self._log_path = log_path
        self._extra_args = extra_args
        self.access = access
        self._headers = access.http_headers if access is not None else {}
        self._proc: subprocess.Popen[bytes] | None = None
        self._endpoints: TritonEndpoints | None = None
        self._shm_regions: set[str] = set()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def endpoints(self) -> TritonEndpoints:
        if self._endpoints is None:
            raise TritonServerError("tritonserver has not been started")
        return self._endpoints

    @property
    def log_path(self) -> Path:
        return self._log_path

    def command(self, repo: Path, endpoints: TritonEndpoints) -> list[str]:
        """The full command line; every listener binds where ``endpoints`` says (loopback by default)."""
        cmd = [str(self._install.server), "--model-repository", str(repo)]
        if self._install.backend_dir is not None:
            cmd += ["--backend-directory", str(self._install.backend_dir)]
        cmd += [
            "--http-address", endpoints.http_address or endpoints.host,
            "--http-port", str(endpoints.http_port),
            "--grpc-address", endpoints.grpc_address or endpoints.host,
            "--grpc-port", str(endpoints.grpc_port),
            "--metrics-address", endpoints.metrics_address or endpoints.host,
            "--metrics-port", str(endpoints.metrics_port),
            "--log-verbose", "0",
            *(self.access.flags() if self.access is not None else []),
            *self._extra_args,
        ]  # fmt: skip
        return cmd

    def start(
        self, repo: Path, env: dict[str, str] | None = None, listen: TritonListen | None = None
    ) -> TritonEndpoints:
        """Launch the server (default: free loopback ports); ``env`` adds to the install's environment."""
        if self._proc is not None:
            raise TritonServerError("tritonserver is already started")
        endpoints = (listen or TritonListen()).endpoints()
        return self._launch(repo, env, endpoints, log_mode="wb")

    def restart(self, repo: Path, env: dict[str, str] | None = None) -> TritonEndpoints:
        """Kill the server now (its requests in flight fail at once) and start a new one on the
        same ports, so that clients reconnect to the address they know."""
        endpoints = self.endpoints
        if self._proc is not None:
            self._remember_shm_regions()
            _kill_group(self._proc.pid)
            self._reap(self._proc)
        self._proc = None
        return self._launch(repo, env, endpoints, log_mode="ab")  # keep the log of the crash

    def _launch(
        self, repo: Path, env: dict[str, str] | None, endpoints: TritonEndpoints, log_mode: str
    ) -> TritonEndpoints:
        environment = self._install.environment()
        environment.update(env or {})
        self._log_path.parent.mkdir(parents=True, exist_ok=True)
        cmd = self.command(repo, endpoints)
        logger.debug("starting %s", " ".join(cmd))
        with open(self._log_path, log_mode) as log:
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=environment,
                start_new_session=True,
            )
        self._endpoints = endpoints
        return endpoints

    def model_processes(self) -> list[int]:
        """The live Python-backend stubs of this server (the processes that run the model)."""
        if self._proc is None:
            return []
        members = _group_members(self._proc.pid, include_zombies=False)
        return [pid for pid in members if Path((_cmdline(pid) or [""])[0]).name == STUB_NAME]

    @staticmethod
    def still_running(pids: set[int]) -> set[int]:
        """Those of ``pids`` that still run (zombies do not): one small /proc read each, cheap
        enough to ask several times a second, where ``model_processes`` scans every process."""
        return {pid for pid in pids if _running(pid)}

    def probe_model(self, model: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
        """Ask the model the readiness probe (``contract.HEALTH_PROBE``) over Triton's HTTP
        generate endpoint: None when it answered, otherwise what went wrong."""
        url = f"{self.endpoints.http_url}/v2/models/{quote(model, safe='')}/generate"
        body = json.dumps({HEALTH_PROBE: True}).encode()
        headers = {"Content-Type": "application/json", **self._headers}
        request = urllib.request.Request(url, data=body, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - loopback URL we built
                return None if response.status == 200 else f"HTTP {response.status}"
        except urllib.error.HTTPError as exc:  # the model (or Triton) answered with an error
            return f"HTTP {exc.code}: {exc.read(2000).decode('utf-8', 'replace')}"
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            return f"no answer within {timeout:g} s: {exc}"

    def version(self) -> str | None:
        """The running server's version (Triton's server metadata), or None if it does not say."""
        request = urllib.request.Request(self.endpoints.http_url + "/v2", headers=self._headers)
        try:
            with urllib.request.urlopen(request, timeout=PROBE_TIMEOUT_S) as response:  # noqa: S310 - loopback URL
                version = json.loads(response.read(65536)).get("version")
        except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError) as exc:
            logger.warning("could not read tritonserver's version: %s", exc)
            return None
        return version if isinstance(version, str) else None

    def exit_code(self) -> int | None:
        """None while the server runs (or was never started), else its exit status."""
        return self._proc.poll() if self._proc is not None else None

    def wait_ready(self, timeout: float, model: str | None = None) -> None:
        """Block until ``model`` (default: every model, via server readiness) is ready.

        Raises ``TritonServerError`` with the end of the log if the server exits first or
        ``timeout`` seconds pass.
        """
        endpoints = self.endpoints
        path = f"/v2/models/{quote(model, safe='')}/ready" if model else "/v2/health/ready"
        deadline = time.monotonic() + timeout
        while True:
            # Stubs start while models load; seeing them early covers a server that dies loading.
            self._remember_shm_regions()
            code = self.exit_code()
            if code is not None:
                raise TritonServerError(f"tritonserver exited with status {code} while starting: {self._why()}")
            if _http_ok(endpoints.http_url + path, self._headers):
                self._remember_shm_regions()
                return
            if time.monotonic() >= deadline:
                raise TritonServerError(f"tritonserver was not ready after {timeout:.0f} s: {self._why()}")
            time.sleep(POLL_INTERVAL_S)

    def wait_exit(self, timeout: float | None) -> int | None:
        """Wait up to ``timeout`` seconds for the server to exit; its status, or None if it runs on."""
        if self._proc is None:
            return None
        try:
            return self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM, wait up to ``timeout`` s, then SIGKILL the whole group; clean up its shm regions.

        Safe to call twice, and after the server died on its own. Returns the exit status.
        """
        proc = self._proc
        if proc is None:
            return None
        self._remember_shm_regions()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                logger.warning("tritonserver (pid %d) did not stop in %g s; killing it", proc.pid, timeout)
                _kill_group(proc.pid)
        self._reap(proc)
        return proc.returncode

    def _reap(self, proc: subprocess.Popen[bytes]) -> None:
        proc.wait()
        # A stub whose server was killed lingers for a while; the group still names it.
        if _group_alive(proc.pid):
            _kill_group(proc.pid)
            _wait_group_gone(proc.pid, timeout=5.0)
        self._remove_own_shm_regions()

    def _why(self) -> str:
        summary = failure_summary(self._log_path)
        return summary if "\n" not in summary else "\n" + summary

    def log_tail(self, lines: int = 40) -> str:
        try:
            with open(self._log_path, encoding="utf-8", errors="replace") as log:
                return "".join(deque((line for line in log if not is_noise(line)), maxlen=lines))
        except FileNotFoundError:
            return "(no tritonserver log)"

    def _remember_shm_regions(self) -> None:
        """Record the shm regions named on the command lines of this server's stubs."""
        if self._proc is None:
            return
        for pid in _group_members(self._proc.pid):
            for arg in _cmdline(pid):
                if arg.startswith(SHM_PREFIX) and "/" not in arg:
                    self._shm_regions.add(arg)

    def _remove_own_shm_regions(self) -> None:
        for name in sorted(self._shm_regions):
            path = SHM_DIR / name
            if path.exists():
                logger.info("removing shared memory left by tritonserver: %s", path)
                path.unlink(missing_ok=True)
        self._shm_regions.clear()


def _http_ok(url: str, headers: dict[str, str]) -> bool:
    try:
        request = urllib.request.Request(url, headers=headers)
        with urllib.request.urlopen(request, timeout=2.0) as response:  # noqa: S310 - loopback URL we built
            return bool(response.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        # Not listening yet, or listening but not ready (400/503): keep polling.
        return False


def _group_members(pgid: int, include_zombies: bool = True) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # the process ended while we looked
        # After the command name (field 2, may hold spaces): state, ppid, process group.
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 2 and int(fields[2]) == pgid and (include_zombies or fields[0] != "Z"):
            members.append(int(entry.name))
    return members


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False  # gone (and reaped)
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode("utf-8", "replace") for part in raw.split(b"\0") if part]


def _group_alive(pgid: int) -> bool:
    # Zombies do not count: in a container whose init does not reap, they never disappear.
    return bool(_group_members(pgid, include_zombies=False))


def _kill_group(pgid: int) -> None:
    # Already gone is the goal, not an error.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def _wait_group_gone(pgid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)


def version_problem(version: str | None) -> str | None:
    """What is wrong with running tritonserver ``version`` in production, if anything."""
    if version is None:
        return "tritonserver did not say its version; make sure it is 2.59 (NGC 25.07) or newer"
    numbers = tuple(int(part) for part in re.findall(r"\d+", version)[:2])
    if numbers >= FIXED_VERSION:
        return None
    return (
        f"tritonserver {version} is older than 2.59 (NGC 25.07), the release that fixed the published "
        "shared-memory and HTTP vulnerabilities (CVE-2025-23319/23320/23334, CVE-2025-23310/23311); "
        "in production run the NGC Triton container 25.07 or newer (docs/security.md)"
    )
