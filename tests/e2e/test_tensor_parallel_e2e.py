"""Tensor parallel through the real tritonserver: ``triton-chat serve --tensor-parallel-size 2``
answers exactly as one rank does, a killed rank makes readiness 503 until the launcher has
restarted the model, and nothing is left running after the launcher stops."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from openai_frontend.launcher import supervisor
from tests.e2e.test_smoke import _finish, _read_until, _start_launcher

WORKER_MODULE = "python_backend.parallel.worker"
# Eight prompts of different lengths and output lengths, sent at once: they share the batch.
PROMPTS = [("the quick brown fox " * (2 * i + 1)) + f"question {i}?" for i in range(8)]
RESTART_DEADLINE_S = supervisor.HANG_RESTART_S + supervisor.PROBE_INTERVAL_S + 180


def _rank_pids(model_dir: Path) -> list[int]:
    """Live worker ranks serving ``model_dir``, wherever they are (none must outlive the launcher)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if WORKER_MODULE in command and str(model_dir) in command and state != "Z":
            pids.append(int(entry.name))
    return pids


def _chat(http: httpx.Client, content: str, **params: Any) -> str:
    body = {"model": "tiny", "messages": [{"role": "user", "content": content}], **params}
    reply = http.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.text
    return str(reply.json()["choices"][0]["message"]["content"])


def _answers(http: httpx.Client) -> list[str]:
    """The eight greedy answers (sent concurrently), then a seeded sample."""
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        greedy = list(
            pool.map(lambda i: _chat(http, PROMPTS[i], temperature=0, max_tokens=12 + 3 * i), range(len(PROMPTS)))
        )
    seeded = _chat(http, "tell me a story", temperature=0.9, top_p=0.95, seed=1234, max_tokens=24)
    return [*greedy, seeded]


def _serve(model_dir: Path, tmp_path: Path, ranks: int) -> tuple[Any, int, list[str]]:
    launcher, port = _start_launcher(
        model_dir, tmp_path, "--tensor-parallel-size", str(ranks), "--max-iter-times", "64"
    )
    lines: list[str] = []
    _read_until(launcher, f"serving 'tiny' at http://127.0.0.1:{port}/v1", lines)
    return launcher, port, lines


def _answers_of(model_dir: Path, tmp_path: Path, ranks: int) -> list[str]:
    launcher, port, lines = _serve(model_dir, tmp_path / f"tp{ranks}", ranks)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as http:
            return _answers(http)
    finally:
        assert _finish(launcher, signal.SIGINT, lines) == 0, "".join(lines)


@pytest.mark.parametrize("model", ["tiny_llama_dir", "tiny_model_dir"])
def test_two_ranks_serve_what_one_rank_serves(model: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    model_dir: Path = request.getfixturevalue(model)
    (tmp_path / "tp1").mkdir()
    (tmp_path / "tp2").mkdir()
    one = _answers_of(model_dir, tmp_path, 1)
    two = _answers_of(model_dir, tmp_path, 2)
    assert len(set(one[:-1])) == len(PROMPTS) and all(one)  # real, distinct text to compare
    assert two == one
    assert _rank_pids(model_dir) == []


def test_a_killed_rank_makes_readiness_503_until_the_model_is_back(tiny_llama_dir: Path, tmp_path: Path) -> None:
    launcher, port, lines = _serve(tiny_llama_dir, tmp_path, 2)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as http:
            before = _chat(http, PROMPTS[2], temperature=0, max_tokens=16)
            ranks = _rank_pids(tiny_llama_dir)
            assert len(ranks) == 1 and http.get("/health/ready").status_code == 200
            os.kill(ranks[0], signal.SIGKILL)
            killed = time.monotonic()
            while http.get("/health/ready").status_code == 200 and time.monotonic() - killed < 15:
                time.sleep(0.1)
            unready = http.get("/health/ready")
            unready_after = time.monotonic() - killed
            while http.get("/health/ready").status_code != 200 and time.monotonic() - killed < RESTART_DEADLINE_S:
                time.sleep(0.5)
            after = _chat(http, PROMPTS[2], temperature=0, max_tokens=16)
            new_ranks = _rank_pids(tiny_llama_dir)
        _read_until(launcher, "the model is ready again", lines, timeout=30)
    finally:
        code = _finish(launcher, signal.SIGINT, lines)
    output = "".join(lines)
    assert unready.status_code == 503 and unready_after < 15
    assert after == before
    assert len(new_ranks) == 1 and new_ranks != ranks
    assert code == 0, output
    assert _rank_pids(tiny_llama_dir) == []
