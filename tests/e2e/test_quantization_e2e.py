"""Quantized weights through the real tritonserver, asked with the openai client (docs/quantization.md):
``triton-chat serve --model <compressed-tensors W8A8 folder>`` and ``serve --quantization int8`` (with
``--quantize-lm-head`` too) on the tiny model trained to think, streamed and not, answer as the float
model does."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.e2e.test_smoke import _finish, _read_until, _start_launcher
from tests.fixtures.quantized_models import build_quantized
from tests.fixtures.trained_models import ANSWER, THINK_QUESTION, THOUGHT


@pytest.fixture(scope="module")
def trained_w8a8_dir(trained_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_quantized(trained_model_dir, tmp_path_factory.mktemp("trained-w8a8"), "w8a8")


def _reasoning(part: Any) -> str:
    return str((part.model_extra or {}).get("reasoning_content") or "")


def _ask_both_ways(port: int) -> tuple[str, str]:
    """The whole reply, and the streamed deltas joined, to the trained thinking question (greedy)."""
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=120)
    messages: list[openai.types.chat.ChatCompletionMessageParam] = [{"role": "user", "content": THINK_QUESTION}]
    reply = client.chat.completions.create(model="tiny", messages=messages, temperature=0, max_tokens=256)
    stream = client.chat.completions.create(model="tiny", messages=messages, temperature=0, max_tokens=256, stream=True)
    # The thought comes back as reasoning_content where the server parses reasoning, else inline.
    deltas = [_reasoning(c.choices[0].delta) + (c.choices[0].delta.content or "") for c in stream if c.choices]
    message = reply.choices[0].message
    return _reasoning(message) + (message.content or ""), "".join(deltas)


def _serve_and_ask(folder: Path, tmp_path: Path, *flags: str) -> tuple[str, str, str]:
    """The whole reply, the streamed one, and tritonserver's log (the model's load is logged there)."""
    # The whole trained reply: more output tokens than the smoke launcher's default allows.
    launcher, port = _start_launcher(folder, tmp_path, "--max-iter-times", "256", *flags)
    lines: list[str] = []
    try:
        _read_until(launcher, f"serving 'tiny' at http://127.0.0.1:{port}/v1", lines)
        whole, streamed = _ask_both_ways(port)
    finally:
        code = _finish(launcher, signal.SIGINT, lines)
    assert code == 0, "".join(lines)
    return whole, streamed, (tmp_path / "tritonserver.log").read_text(encoding="utf-8")


@pytest.mark.parametrize("kind", ["w8a8-folder", "int8-at-load", "int8-with-head"])
def test_quantized_model_answers_as_trained(
    kind: str, trained_model_dir: Path, trained_w8a8_dir: Path, tmp_path: Path
) -> None:
    if kind == "w8a8-folder":
        whole, streamed, log = _serve_and_ask(trained_w8a8_dir, tmp_path)
    elif kind == "int8-at-load":
        whole, streamed, log = _serve_and_ask(trained_model_dir, tmp_path, "--quantization", "int8")
    else:
        whole, streamed, log = _serve_and_ask(
            trained_model_dir, tmp_path, "--quantization", "int8", "--quantize-lm-head"
        )
    assert ("output head W8A8 int8" in log) == (kind == "int8-with-head"), log
    # The trained reply, word for word: int8 weights and activations (the head's too) keep every
    # greedy choice.
    for text in (whole, streamed):
        assert THOUGHT in text and text.rstrip().endswith(ANSWER), text
    assert whole == streamed


def test_none_refuses_a_quantized_folder(trained_w8a8_dir: Path, tmp_path: Path) -> None:
    launcher, _ = _start_launcher(trained_w8a8_dir, tmp_path, "--quantization", "none")
    # The launcher gives up when the model cannot load, and says why.
    assert launcher.stderr is not None
    log = launcher.stderr.read()
    code = launcher.wait(timeout=60)
    assert code != 0
    assert "quantization 'none' needs a 16/32-bit folder" in log, log
