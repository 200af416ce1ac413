"""Speculative decoding through the real tritonserver: `triton-chat serve --speculative-ngram-tokens 4`
and `triton-chat serve --speculative-model DIR`.

The same greedy requests to a server without speculation and to one with it get the same
answers, streamed and not, and the second's Triton metrics count accepted drafts. The model is
the tiny one with its MLPs silenced (``tests/fixtures/looping_model.py``), whose answers copy
and loop, so n-gram drafts are accepted; as the draft model, the tiny random one (same tokenizer)
proposes, and disagrees often.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from openai_frontend.launcher.network import free_port
from tests.e2e.test_smoke import _finish, _read_until, _start_launcher, _stream_chunks
from tests.fixtures.looping_model import build_looping_model

PROMPTS = [
    "Repeat after me: the software is provided as is, without warranty of any kind. "
    "The software is provided as is, without warranty of any kind.",
    "why is the sky blue",
    "count to ten",
]


def _answers(model: Path, tmp_path: Path, *flags: str) -> tuple[list[Any], dict[str, float]]:
    """Each prompt's greedy answer (text, finish reason, tokens) and streamed text chunks, and
    the server's ``triton_chat_spec_decode_*`` metrics after them."""
    tmp_path.mkdir()
    metrics_port = free_port()
    launcher, port = _start_launcher(
        model, tmp_path, "--max-iter-times", "64", "--triton-metrics-port", str(metrics_port), *flags
    )
    lines: list[str] = []
    answers: list[Any] = []
    try:
        _read_until(launcher, f"serving 'tiny' at http://127.0.0.1:{port}/v1", lines)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as http:
            for prompt in PROMPTS:
                body = {"model": "tiny", "messages": [{"role": "user", "content": prompt}],
                        "temperature": 0, "max_tokens": 48, "ignore_eos": True}  # fmt: skip
                reply = http.post("/v1/chat/completions", json=body).json()
                choice = reply["choices"][0]
                chunks = [c["choices"][0]["delta"].get("content") for c in _stream_chunks(http, body) if c["choices"]]
                tokens = reply["usage"]["completion_tokens"]
                answers.append((choice["message"]["content"], choice["finish_reason"], tokens, chunks))
        metrics = _settled_metrics(f"http://127.0.0.1:{metrics_port}/metrics")
    finally:
        code = _finish(launcher, signal.SIGINT, lines)
    assert code == 0, "".join(lines)
    return answers, metrics


def _settled_metrics(url: str) -> dict[str, float]:
    """The spec-decode samples once two reads agree (the model refreshes them every 0.5 s)."""
    previous: dict[str, float] | None = None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        text = httpx.get(url, timeout=10).text
        samples = {
            s.name: s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name.startswith("triton_chat_spec_decode_")
        }
        if samples and samples == previous:
            return samples
        previous = samples
        time.sleep(1.0)  # polling Triton's endpoint: there is no event to wait on across processes
    raise AssertionError(f"spec-decode metrics never settled: {previous}")


def test_serve_with_speculation_answers_exactly_as_without(tiny_model_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    model = build_looping_model(tiny_model_dir, tmp_path / "model")
    off, _ = _answers(model, tmp_path / "off")
    on, metrics = _answers(model, tmp_path / "on", "--speculative-ngram-tokens", "4")
    assert on == off
    assert all(tokens == 48 for _, _, tokens, _ in on)
    drafted = metrics["triton_chat_spec_decode_num_draft_tokens"]
    assert 0 < metrics["triton_chat_spec_decode_num_accepted_tokens"] <= drafted
    drafted_by_model, metrics = _answers(model, tmp_path / "draft", "--speculative-model", str(tiny_model_dir))
    assert drafted_by_model == off
    assert (
        0
        <= metrics["triton_chat_spec_decode_num_accepted_tokens"]
        < metrics["triton_chat_spec_decode_num_draft_tokens"]
    )
