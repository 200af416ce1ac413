"""A start a person can watch, as `triton-chat serve` prints it: the stages in order, each with the
seconds since start, tritonserver's log named; and a start that fails names the log and shows
its last lines. Off a terminal (a pipe here) there are no control characters."""

from __future__ import annotations

import os
import pty
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from openai_frontend.launcher.log_format import ERASE_LINE
from openai_frontend.launcher.network import free_port
from tests.e2e.processes import stop
from tests.e2e.test_smoke import REPO_ROOT, _finish, _read_until, _start_launcher

STAGE = re.compile(r"^triton-chat: \[ *(?P<seconds>\d+\.\d)s\] (?P<text>.*)$")


def _stages(output: str) -> list[tuple[float, str]]:
    return [(float(m["seconds"]), m["text"]) for m in map(STAGE.match, output.splitlines()) if m is not None]


def _first(stages: list[tuple[float, str]], start: str) -> int:
    return next(i for i, (_, text) in enumerate(stages) if text.startswith(start))


def _has_compiler() -> bool:
    return bool(shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc"))


def test_a_first_start_shows_its_stages_in_order_with_the_seconds(tiny_model_dir: Path, tmp_path: Path) -> None:
    # A cache of its own: the CPU kernels are compiled, as on a machine's first start.
    cache = tmp_path / "cache"
    launcher, port = _start_launcher(tiny_model_dir, tmp_path, env={"TRITON_CHAT_CACHE": str(cache)})
    lines: list[str] = []
    try:
        _read_until(launcher, f"frontend ready: serving 'tiny' at http://127.0.0.1:{port}/v1", lines)
    finally:
        code = _finish(launcher, signal.SIGINT, lines)
    output = "".join(lines)
    assert code == 0, output
    assert "\r" not in output and "\x1b" not in output
    stages = _stages(output)
    texts = [text for _, text in stages]
    order = [
        _first(stages, "started tritonserver (pid "),
        _first(stages, f"loading weights ({tiny_model_dir.name}, float32)"),
        _first(stages, f"weights loaded ({tiny_model_dir.name}, float32, "),
        _first(stages, "tritonserver ready (pid "),
        _first(stages, "frontend ready: serving 'tiny'"),
    ]
    assert order == sorted(order), texts
    assert texts[order[0]].endswith(f"; log: {tmp_path / 'tritonserver.log'}"), texts
    if _has_compiler():
        kernels = [i for i, text in enumerate(texts) if text.startswith("built CPU kernel ")]
        assert kernels and order[0] < min(kernels) and max(kernels) < order[3], texts
    seconds = [elapsed for elapsed, _ in stages]
    assert seconds == sorted(seconds), stages
    assert 0 < seconds[order[3]] <= seconds[order[4]] < 240  # within the test's wait


def test_a_failed_start_names_the_log_and_shows_its_last_lines(tiny_model_dir: Path, tmp_path: Path) -> None:
    broken = Path(shutil.copytree(tiny_model_dir, tmp_path / "broken"))
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # the header says more than the file holds
    launcher, _ = _start_launcher(broken, tmp_path)
    _, err = launcher.communicate(timeout=240)
    log = tmp_path / "tritonserver.log"
    assert launcher.returncode == 1, err
    stages = _stages(err)
    assert _first(stages, "loading weights failed (broken: ") < _first(stages, "start failed: tritonserver exited")
    failed = next(text for _, text in stages if text.startswith("start failed: "))
    assert "the model 'triton_chat' failed to load: " in failed, err
    shown = err.split(f"triton-chat: tritonserver's log is {log}; its last lines:\n", 1)[1].splitlines()
    tail = [line[2:].removesuffix(" ...") for line in shown if line.startswith("  ")]
    assert len(tail) >= 3, err
    log_lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    assert all(any(line.startswith(part) for line in log_lines) for part in tail), (tail, err)
    assert "error: creating server" in tail[-1], err


def test_on_a_terminal_a_status_line_moves_below_whole_stage_lines(tiny_model_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    cmd = [
        sys.executable, "-m", "openai_frontend.launcher", "serve", "--model", str(tiny_model_dir),
        "--served-model-name", "tiny", "--port", str(port), "--dtype", "float32", "--device", "cpu",
        "--triton-log", str(tmp_path / "tritonserver.log"), "--ready-timeout", "180",
    ]  # fmt: skip
    terminal, stderr = pty.openpty()
    launcher = subprocess.Popen(
        cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True
    )
    os.close(stderr)
    chunks: list[bytes] = []
    ready = threading.Event()

    def drain() -> None:  # to the end, so that the launcher never blocks on a full terminal
        while True:
            try:
                chunk = os.read(terminal, 65536)
            except OSError:  # EIO: every writer is gone
                return
            if not chunk:
                return
            chunks.append(chunk)
            if b"frontend ready" in b"".join(chunks[-2:]):
                ready.set()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 240
        while not ready.wait(0.5):
            assert launcher.poll() is None and time.monotonic() < deadline, b"".join(chunks)
    finally:
        code = stop(launcher, signal.SIGINT, timeout=90)
        reader.join(10)
        os.close(terminal)
    screen = b"".join(chunks).decode("utf-8", "replace")
    assert code == 0, screen
    assert ERASE_LINE in screen and "starting tritonserver and the model ..." in screen, screen
    # Each stage line starts on a fresh line or where the status line was just erased.
    for line in ("weights loaded (", "tritonserver ready (pid ", "frontend ready: serving 'tiny'"):
        at = screen.index(line)
        start = screen.rindex("triton-chat: [", 0, at)
        assert screen[:start].endswith(("\n", ERASE_LINE)), screen[max(start - 80, 0) : at]
        assert "\r" not in screen[start:at], screen[start:at]
