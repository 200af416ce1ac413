"""A start a person can watch, as `triton-chat serve` prints it: the stages in order, each with the
seconds since start, tritonserver's log named; and a start that fails names the log and shows
its last lines. Off a terminal (a pipe here) there are no control characters."""

from __future__ import annotations

import os
import re
import shutil
import signal
from pathlib import Path

from tests.e2e.test_smoke import _finish, _read_until, _start_launcher

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
