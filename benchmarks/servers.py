"""Starting and stopping the servers a benchmark measures, each on a free loopback port.

Owns: ``ServedProcess`` (a server started by this process, waited for, stopped by its PID and
process group), the command lines for our launcher and for vLLM's CPU build, the command-line
flags every served benchmark takes (``served_model_parser``) and its SIGTERM handling
(``exit_on_sigterm``), ``PeriodicSampler`` (a thread sampling something while a load runs),
sampling the peak resident memory of a process tree while a load runs, and ``CpuShares`` (the
CPU each process of a served path and the load generator used during a load).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import httpx
import psutil

from openai_frontend.launcher.network import free_port

START_TIMEOUT_S = 900.0
_Sampler = TypeVar("_Sampler", bound="PeriodicSampler")


def served_model_parser(
    description: str | None, model_help: str = "local model folder", dtype: str = "bfloat16"
) -> argparse.ArgumentParser:
    """A benchmark's command line, with the model folder (``--model``) and ``--dtype`` it serves."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help=model_help)
    parser.add_argument("--dtype", default=dtype)
    return parser


def exit_on_sigterm(signum: int, frame: object) -> None:
    """A SIGTERM handler (a timeout): SystemExit unwinds through each ``finally`` and ``with``, so
    no server this benchmark started outlives it."""
    raise SystemExit(128 + signum)


@dataclass
class ServedProcess:
    label: str
    command: list[str]
    env: dict[str, str]
    port: int
    log: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def pid(self) -> int:
        """The server's PID (its process group's leader); it must have been started."""
        if self.process is None:
            raise RuntimeError(f"{self.label} was not started")
        return self.process.pid

    def start(self) -> None:
        sink = self.log.open("w")
        self.process = subprocess.Popen(
            self.command, env=self.env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
        sink.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.label} exited early; see {self.log}")
            try:
                if httpx.get(f"{self.base_url}/models", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        self.stop()
        raise RuntimeError(f"{self.label} did not start in time; see {self.log}")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def ours(
    model_dir: str | None,
    dtype: str,
    log: Path,
    max_num_seqs: int = 64,
    extra_args: tuple[str, ...] = (),
    label: str = "triton-chat",
) -> ServedProcess:
    """``triton-chat serve`` of ``model_dir`` (None: the demo model, as ``serve`` without ``--model``)."""
    port = free_port()
    model = ("--model", model_dir) if model_dir is not None else ()
    command = [
        sys.executable, "-m", "openai_frontend.launcher", "serve", *model, "--port", str(port),
        "--dtype", dtype, "--max-num-seqs", str(max_num_seqs), "--served-model-name", "bench", *extra_args,
    ]  # fmt: skip
    return ServedProcess(label, command, dict(os.environ), port, log)


def vllm_router(binary: str, worker_urls: list[str], policy: str, log: Path) -> ServedProcess:
    """vLLM's router (its own binary) over ``worker_urls`` (each ``http://host:port``)."""
    port = free_port()
    command = [
        binary, "--host", "127.0.0.1", "--port", str(port), "--policy", policy, "--worker-urls", *worker_urls,
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
    ]  # fmt: skip
    return ServedProcess("vllm-router", command, dict(os.environ), port, log)


def vllm(python: str, model_dir: str, dtype: str, log: Path, extra_args: tuple[str, ...] = ()) -> ServedProcess:
    """vLLM's CPU build, run the way its CPU docs recommend (both cores bound)."""
    port = free_port()
    env = dict(os.environ)
    env.update(
        VLLM_CPU_KVCACHE_SPACE="4", VLLM_HOST_IP="127.0.0.1", HF_HUB_OFFLINE="1", VLLM_CPU_OMP_THREADS_BIND="0-1"
    )
    command = [
        python, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir, "--served-model-name", "bench",
        "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype, "--max-model-len", "2048", *extra_args,
    ]  # fmt: skip
    return ServedProcess("vllm-cpu", command, env, port, log)


class PeriodicSampler(ABC):
    """Calls ``sample`` on a daemon thread while the ``with`` block runs: at its start, then every
    ``interval_s`` until it ends."""

    interval_s: float
    _stop: threading.Event
    _thread: threading.Thread

    @abstractmethod
    def sample(self) -> None:
        """Take one sample."""

    def __enter__(self: _Sampler) -> _Sampler:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=type(self).__name__, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self.interval_s):
                return


@dataclass
class PeakMemory(PeriodicSampler):
    """Samples the resident memory of a process and its descendants until stopped."""

    root_pid: int
    peak_bytes: int = 0
    by_name: dict[str, int] = field(default_factory=dict)
    interval_s: float = 0.2

    def sample(self) -> None:
        try:
            procs = _tree(self.root_pid)
        except psutil.Error:
            return  # the server is gone: its peak so far stands
        total = 0
        for proc in procs:
            try:
                rss = proc.memory_info().rss
                name = Path(proc.cmdline()[0]).name if proc.cmdline() else proc.name()
            except psutil.Error:
                continue
            total += rss
            self.by_name[name] = max(self.by_name.get(name, 0), rss)
        self.peak_bytes = max(self.peak_bytes, total)


def _tree(root_pid: int) -> list[psutil.Process]:
    """The process ``root_pid`` and all its descendants."""
    root = psutil.Process(root_pid)
    return [root, *root.children(recursive=True)]


def _role(proc: psutil.Process, root_pid: int) -> str:
    if proc.pid == os.getpid():
        return "client"
    if proc.pid == root_pid:
        return "launcher"
    command = " ".join(proc.cmdline())
    if "triton_python_backend_stub" in command:
        return "stub"
    return "tritonserver" if "tritonserver" in command else Path(proc.name()).name


@dataclass
class CpuShares:
    """CPU time of the server's processes and of this one (the client) between enter and exit.

    On a machine whose cores the engine computes on, every other process's CPU is taken from the
    engine (docs/performance.md): the shares say where a served figure's gap went. Each share is
    a percentage of one core over the wall time.
    """

    root_pid: int
    shares: dict[str, float] = field(default_factory=dict)
    _start: dict[int, tuple[str, float]] = field(default_factory=dict)
    _started: float = 0.0

    def _times(self) -> dict[int, tuple[str, float]]:
        try:
            procs = [psutil.Process(), *_tree(self.root_pid)]
        except psutil.Error:
            return {}
        times = {}
        for proc in procs:
            try:
                cpu = proc.cpu_times()
                times[proc.pid] = (_role(proc, self.root_pid), cpu.user + cpu.system)
            except psutil.Error:
                continue  # ended while we looked; its time is lost to the figure, not to the load
        return times

    def __enter__(self) -> CpuShares:
        self._start, self._started = self._times(), time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        wall = time.perf_counter() - self._started
        shares: dict[str, float] = {}
        for pid, (role, cpu) in self._times().items():
            used = cpu - self._start.get(pid, (role, 0.0))[1]
            shares[role] = shares.get(role, 0.0) + used
        self.shares = {role: round(100 * used / wall, 1) for role, used in sorted(shares.items())} if wall > 0 else {}
