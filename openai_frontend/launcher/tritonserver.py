"""One ``tritonserver`` process: start on private Unix sockets (or the ports asked for), wait until
ready, restart on the same addresses, stop without leftovers.

Owns ``TritonServerProcess`` (used by the launcher and by the end-to-end tests): the command line,
the model's health probe over HTTP, readiness and shutdown. Where it listens is
``triton_endpoints``, who may call it ``triton_access``. The server runs in its own session and
process group so that a terminal's Ctrl-C reaches only the launcher, which then stops the server in
order; the group id also lets ``stop()`` find and kill a Python-backend stub that outlives its
server (``process_group``). Shared-memory regions are attributed to this server by the stub
command lines (never by timing, because other servers may run on the same machine) and removed
only if the server could not remove them itself.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import signal
import subprocess
import time
from collections import deque
from pathlib import Path
from urllib.parse import quote

from openai_frontend.launcher.local_http import HttpCallError, http_call
from openai_frontend.launcher.process_group import (
    cmdline,
    group_alive,
    group_members,
    kill_group,
    running,
    wait_group_gone,
)
from openai_frontend.launcher.tied_child import TiedSpawner
from openai_frontend.launcher.triton_access import RestrictedAccess
from openai_frontend.launcher.triton_endpoints import TritonEndpoints, TritonListen, private_socket_dir
from openai_frontend.launcher.triton_install import TritonInstall
from openai_frontend.launcher.triton_log import failure_summary, is_noise, last_lines, load_error
from python_backend.protocol.contract import HEALTH_PROBE

logger = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "triton_python_backend_shm_region_"
STUB_NAME = "triton_python_backend_stub"  # the Python backend's per-instance model process
STOP_TIMEOUT_S = 30.0
POLL_INTERVAL_S = 0.25
PROBE_TIMEOUT_S = 2.0
FAILURE_TAIL_LINES = 20  # of the log, shown when a start fails


class TritonServerError(RuntimeError):
    """tritonserver did not start or become ready; the message carries the end of its log."""


class TritonStartError(TritonServerError):
    """tritonserver exited, or was not ready in time, while starting. ``what`` says which, with the
    model's load error when the log names one; ``tail``: the log's last lines, without noise."""

    def __init__(self, what: str, log_path: Path, tail: str) -> None:
        summary = failure_summary(log_path)
        super().__init__(f"{what}: {summary}" if "\n" not in summary else f"{what}:\n{summary}")
        try:
            error = load_error(log_path.read_text(encoding="utf-8", errors="replace").splitlines())
        except FileNotFoundError:
            error = None
        self.what = f"{what}: {error}" if error is not None else what
        self.log_path = log_path
        self.tail = tail


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
        self._socket_dir: Path | None = None  # the private listeners' directory (mode 0700)
        self._spawner = TiedSpawner()  # the server is killed with this process, SIGKILL included

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
        """The full command line; every listener binds where ``endpoints`` says (a private Unix
        socket by default). No secret is on it: another local user can read any command line."""
        cmd = [str(self._install.server), "--model-repository", str(repo)]
        if self._install.backend_dir is not None:
            cmd += ["--backend-directory", str(self._install.backend_dir)]
        cmd += [
            "--http-address", endpoints.http.address,
            "--http-port", str(endpoints.http.port),
            "--grpc-address", endpoints.grpc.address,
            "--grpc-port", str(endpoints.grpc.port),
            "--metrics-address", endpoints.metrics.address,
            "--metrics-port", str(endpoints.metrics.port),
            "--log-verbose", "0",
            *(self.access.flags() if self.access is not None else []),
            *self._extra_args,
        ]  # fmt: skip
        return cmd

    def start(
        self, repo: Path, env: dict[str, str] | None = None, listen: TritonListen | None = None
    ) -> TritonEndpoints:
        """Launch the server (default: every listener a private Unix socket); ``env`` adds to the
        install's environment."""
        if self._proc is not None:
            raise TritonServerError("tritonserver is already started")
        listen = listen or TritonListen()
        if len(listen.exposed) < 3 and self._socket_dir is None:
            self._socket_dir = private_socket_dir()
        endpoints = listen.endpoints(self._socket_dir)
        return self._launch(repo, env, endpoints, log_mode="wb")

    def restart(self, repo: Path, env: dict[str, str] | None = None) -> TritonEndpoints:
        """Kill the server now (its requests in flight fail at once) and start a new one on the
        same ports and sockets, so that clients reconnect to the address they know."""
        endpoints = self.endpoints
        if self._proc is not None:
            self._remember_shm_regions()
            kill_group(self._proc.pid)
            self._reap(self._proc)
        self._proc = None
        return self._launch(repo, env, endpoints, log_mode="ab")  # keep the log of the crash

    def _launch(
        self, repo: Path, env: dict[str, str] | None, endpoints: TritonEndpoints, log_mode: str
    ) -> TritonEndpoints:
        environment = self._install.environment()
        environment.update(env or {})
        self._log_path.parent.mkdir(parents=True, exist_ok=True)
        for stale in endpoints.sockets():  # Triton's HTTP server cannot bind over an old socket
            stale.unlink(missing_ok=True)
        cmd = self.command(repo, endpoints)
        logger.debug("starting %s", " ".join(cmd))
        if log_mode == "wb":
            self._log_path.write_bytes(b"")
        self._log_path.chmod(0o600)  # the model's errors may quote a request
        # Appending, so that the log can be cut short while the server writes (``LogRotation``).
        with open(self._log_path, "ab") as log:
            self._proc = self._spawner.popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=environment,
                start_new_session=True,
                umask=0o077,  # what tritonserver and the stub write is this user's alone
            )
        self._endpoints = endpoints
        return endpoints

    def model_processes(self) -> list[int]:
        """The live Python-backend stubs of this server (the processes that run the model)."""
        if self._proc is None:
            return []
        members = group_members(self._proc.pid, include_zombies=False)
        return [pid for pid in members if Path((cmdline(pid) or [""])[0]).name == STUB_NAME]

    @staticmethod
    def still_running(pids: set[int]) -> set[int]:
        """Those of ``pids`` that still run (zombies do not): one small /proc read each, cheap
        enough to ask several times a second, where ``model_processes`` scans every process."""
        return {pid for pid in pids if running(pid)}

    def probe_model(self, model: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
        """Ask the model the readiness probe (``contract.HEALTH_PROBE``) over Triton's HTTP
        generate endpoint: None when it answered, otherwise what went wrong."""
        path = f"/v2/models/{quote(model, safe='')}/generate"
        body = json.dumps({HEALTH_PROBE: True}).encode()
        headers = {"Content-Type": "application/json", **self._headers}
        try:
            answer = http_call(self.endpoints.http, path, body=body, headers=headers, timeout=timeout)
        except HttpCallError as exc:
            return f"no answer within {timeout:g} s: {exc}"
        if answer.status == 200:
            return None
        return f"HTTP {answer.status}: {answer.body[:2000].decode('utf-8', 'replace')}"

    def version(self) -> str | None:
        """The running server's version (Triton's server metadata), or None if it does not say."""
        try:
            answer = http_call(self.endpoints.http, "/v2", headers=self._headers, timeout=PROBE_TIMEOUT_S)
            version = json.loads(answer.body).get("version") if answer.status == 200 else None
        except (HttpCallError, ValueError, AttributeError) as exc:
            logger.warning("could not read tritonserver's version: %s", exc)
            return None
        return version if isinstance(version, str) else None

    def read_metrics(self) -> str:
        """Triton's ``/metrics`` text; ``HttpCallError`` when the server does not answer."""
        answer = http_call(self.endpoints.metrics, "/metrics", timeout=PROBE_TIMEOUT_S)
        if answer.status != 200:
            raise HttpCallError(f"tritonserver's metrics answered HTTP {answer.status}")
        return answer.body.decode("utf-8", "replace")

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
                what = f"tritonserver exited with status {code} while starting"
                raise TritonStartError(what, self._log_path, last_lines(self._log_path, FAILURE_TAIL_LINES))
            if self._http_ok(endpoints, path):
                self._remember_shm_regions()
                return
            if time.monotonic() >= deadline:
                what = f"tritonserver was not ready after {timeout:.0f} s"
                raise TritonStartError(what, self._log_path, last_lines(self._log_path, FAILURE_TAIL_LINES))
            time.sleep(POLL_INTERVAL_S)

    def _http_ok(self, endpoints: TritonEndpoints, path: str) -> bool:
        try:
            return http_call(endpoints.http, path, headers=self._headers, timeout=PROBE_TIMEOUT_S).status == 200
        except HttpCallError:
            return False  # not listening yet; a 400/503 (listening, not ready) also keeps polling

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
                kill_group(proc.pid)
        self._reap(proc)
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = None
        return proc.returncode

    def _reap(self, proc: subprocess.Popen[bytes]) -> None:
        proc.wait()
        # A stub whose server was killed lingers for a while; the group still names it.
        if group_alive(proc.pid):
            kill_group(proc.pid)
            wait_group_gone(proc.pid, timeout=5.0)
        self._remove_own_shm_regions()

    def log_tail(self, lines: int = 40) -> str:
        try:
            with open(self._log_path, encoding="utf-8", errors="replace") as log:
                return "".join(deque((line for line in log if not is_noise(line)), maxlen=lines))
        except FileNotFoundError:
            return "(no tritonserver log)"

    def _remember_shm_regions(self) -> None:
        """Record the shm regions named on the command lines of this server's stubs, and make
        each new one this user's alone: Triton creates them readable by everyone (mode 0644, set
        after creation, so no umask helps), and every request and response passes through them."""
        if self._proc is None:
            return
        for pid in group_members(self._proc.pid):
            for arg in cmdline(pid):
                if arg.startswith(SHM_PREFIX) and "/" not in arg and arg not in self._shm_regions:
                    self._shm_regions.add(arg)
                    _make_private(SHM_DIR / arg)

    def _remove_own_shm_regions(self) -> None:
        for name in sorted(self._shm_regions):
            path = SHM_DIR / name
            if path.exists():
                logger.info("removing shared memory left by tritonserver: %s", path)
                path.unlink(missing_ok=True)
        self._shm_regions.clear()


def _make_private(path: Path) -> None:
    # Gone already: its stub was the model's auto-complete pass, which exits at once.
    with contextlib.suppress(FileNotFoundError):
        path.chmod(0o600)
