"""``serve`` killed outright (SIGKILL, no handler runs) under load leaves no process behind.

tritonserver dies with the launcher (the kernel's parent-death signal), the model's stub and any
tensor-parallel rank with their parent (their lifeline), and the stub removes its shared memory:
within 10 s no process of the tree and no region is left, and the frontend's port is free again.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from openai_frontend.launcher.tritonserver import SHM_DIR, SHM_PREFIX
from tests.e2e.processes import cmdline, descendants
from tests.e2e.test_smoke import _read_until, _start_launcher

pytestmark = pytest.mark.e2e

# An orphan would stay for good; a process that is ending may take seconds on a starved host (a
# CI run once saw a stub outlive 10 s while the suite and another server shared the 2 cores).
GONE_WITHIN_S = 30.0
STREAMS = 4


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie has freed everything; init reaps it


def _stream_until_cut(port: int, index: int, streaming: threading.Event) -> str:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": f"request {index}: tell me a long story"}],
        "max_tokens": 4000,
        "ignore_eos": True,
        "stream": True,
    }
    try:
        with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=60) as reply:
            for _ in reply.iter_lines():
                streaming.set()
    except httpx.HTTPError as exc:
        return type(exc).__name__
    return "finished"


def _run_folders(pids: list[int]) -> set[Path]:
    """The temporary folders this server's processes name (``/tmp/triton-chat-*``)."""
    temp = Path(tempfile.gettempdir())
    found: set[Path] = set()
    for pid in pids:
        for arg in cmdline(pid):
            path = Path(arg.removeprefix("unix:"))
            for parent in (path, *path.parents):
                if parent.parent in (temp, Path("/tmp")) and parent.name.startswith("triton-chat-"):  # noqa: S108
                    found.add(parent)
    return found


def test_sigkill_of_serve_under_load_leaves_no_process(tiny_model_dir: Path, tmp_path: Path) -> None:
    launcher, port = _start_launcher(tiny_model_dir, tmp_path, "--max-iter-times", "4000")
    lines: list[str] = []
    pids: list[int] = []
    folders: set[Path] = set()
    try:
        _read_until(launcher, f"serving 'tiny' at http://127.0.0.1:{port}/v1", lines)
        streaming = threading.Event()
        with ThreadPoolExecutor(STREAMS) as pool:
            outcomes = [pool.submit(_stream_until_cut, port, i, streaming) for i in range(STREAMS)]
            assert streaming.wait(60), "no stream started"
            pids = descendants(launcher.pid)
            assert len(pids) >= 3, pids  # the launcher, tritonserver and the model's stub
            regions = [SHM_DIR / arg for pid in pids for arg in cmdline(pid) if arg.startswith(SHM_PREFIX)]
            assert regions and all(region.exists() for region in regions)
            folders.update(_run_folders(pids))
            assert len(folders) == 2, folders  # the run folder and the private sockets' folder
            os.kill(launcher.pid, signal.SIGKILL)
            launcher.wait()
            killed = time.monotonic()
            while any(_alive(pid) for pid in pids) and time.monotonic() - killed < GONE_WITHIN_S:
                time.sleep(0.1)
            left = {pid: " ".join(cmdline(pid))[:120] for pid in pids if _alive(pid)}
            assert left == {}, f"still running {time.monotonic() - killed:.1f} s after SIGKILL: {left}"
            assert [region for region in regions if region.exists()] == []
            assert all(outcome.result(timeout=60) != "finished" for outcome in outcomes)
        with socket.socket() as probe:  # the frontend's port is free for the next start
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as any server binds
            probe.bind(("127.0.0.1", port))
    finally:
        for pid in pids:  # a failed test leaves nothing running (processes this test started)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        # No handler of serve ran, so its run folder (the model repository) and the folder of its
        # private sockets stay, as any program's temporary files do: this test's own are removed.
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
