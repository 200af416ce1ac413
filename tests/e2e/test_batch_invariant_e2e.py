"""``triton-chat serve --batch-invariant`` in bfloat16: the same prompt answers with the same text alone
and among 8 concurrent others, cold and from the prefix cache, through the real tritonserver."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from openai_frontend.launcher.network import free_port
from tests.e2e.test_smoke import _finish, _read_until

REPO_ROOT = Path(__file__).resolve().parents[2]
GREEDY: dict[str, Any] = {"model": "tiny", "temperature": 0, "max_tokens": 24, "ignore_eos": True}
SYSTEM = "you are a careful assistant who answers in plain words and short sentences. "
OTHERS = [f"question {i}: " + "more words " * (3 * i + 1) for i in range(8)]


def _serve(model: Path, tmp_path: Path) -> tuple[subprocess.Popen[str], int]:
    port = free_port()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")])
    cmd = [
        sys.executable, "-m", "openai_frontend.launcher", "serve", "--model", str(model),
        "--served-model-name", "tiny", "--port", str(port), "--dtype", "bfloat16", "--device", "cpu",
        "--batch-invariant", "--triton-log", str(tmp_path / "tritonserver.log"), "--ready-timeout", "180",
    ]  # fmt: skip
    # Its own session, like a terminal job: the launcher stops its tritonserver itself.
    return subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True), port


def _wait_serving(launcher: subprocess.Popen[str], port: int, timeout: float = 240) -> None:
    _read_until(launcher, f"serving 'tiny' at http://127.0.0.1:{port}/v1", [], timeout)


def _ask(http: httpx.Client, content: str) -> tuple[str, int]:
    body = {**GREEDY, "messages": [{"role": "user", "content": content}]}
    reply = http.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.text
    data = reply.json()
    return data["choices"][0]["message"]["content"], data["usage"]["prompt_tokens_details"]["cached_tokens"]


def _among_others(http: httpx.Client, content: str) -> tuple[str, int]:
    """``content`` sent with 8 other prompts of different lengths, all at once."""
    with ThreadPoolExecutor(max_workers=9) as pool:
        others = [pool.submit(_ask, http, text) for text in OTHERS[:4]]
        target = pool.submit(_ask, http, content)
        others += [pool.submit(_ask, http, text) for text in OTHERS[4:]]
        for other in others:
            other.result()
        return target.result()


def test_the_same_prompt_answers_the_same_alone_in_a_batch_cold_and_cached(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    launcher, port = _serve(tiny_llama_dir, tmp_path)
    try:
        _wait_serving(launcher, port)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as http:
            alone = SYSTEM + "tell me about the old mill"
            fresh = "a new question, nothing like the others, about the weather in the hills and the valleys"
            cold_text, cached = _ask(http, alone)
            assert cached == 0
            again_text, cached = _ask(http, alone)
            assert cached > 0 and again_text == cold_text
            batched_text, cached = _among_others(http, alone)
            assert cached > 0 and batched_text == cold_text
            # A prompt seen first in a batch (cold), then alone (from the prefix cache).
            batch_cold, cached = _among_others(http, fresh)
            assert cached == 0
            alone_text, cached = _ask(http, fresh)
            assert cached > 0 and alone_text == batch_cold
    finally:
        _finish(launcher, signal.SIGINT, [])
