"""`triton-chat serve --kv-cache-dtype bfloat16` through the real tritonserver: a float32 model's
KV budget holds twice the tokens, and concurrent streamed requests finish with their length."""

from __future__ import annotations

import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from openai_frontend.launcher.network import free_port
from python_backend.engine.limits import Limits
from python_backend.protocol.settings import EngineSettings
from tests.e2e.test_smoke import _finish, _read_until, _start_launcher, _stream_chunks
from tests.fixtures.engine_driver import load_on_cpu

_KV_MB = 8


def _budget_tokens(metrics_url: str) -> float:
    text = httpx.get(metrics_url, timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "triton_chat_kv_cache_budget_tokens":
                return sample.value
    raise AssertionError(f"no triton_chat_kv_cache_budget_tokens in:\n{text}")


def test_serve_with_bfloat16_keys_and_values(tiny_model_dir: Path, tmp_path: Path) -> None:
    metrics_port = free_port()
    launcher, port = _start_launcher(
        tiny_model_dir, tmp_path, "--kv-cache-dtype", "bfloat16", "--kv-cache-memory-mb", str(_KV_MB),
        "--triton-metrics-port", str(metrics_port), "--max-iter-times", "64",
    )  # fmt: skip
    lines: list[str] = []
    try:
        _read_until(launcher, f"serving 'tiny' at http://127.0.0.1:{port}/v1", lines)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as http:

            def ask(index: int) -> list[dict[str, Any]]:
                body = {
                    "model": "tiny",
                    "messages": [{"role": "user", "content": f"request {index}: " + "tell me more " * (index + 1)}],
                    "temperature": 0,
                    "max_tokens": 24,
                    "ignore_eos": True,
                    "stream_options": {"include_usage": True},
                }
                return _stream_chunks(http, body)

            with ThreadPoolExecutor(4) as pool:
                streams = list(pool.map(ask, range(4)))
        for chunks in streams:
            finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
            assert finishes[-1] == "length"
            assert chunks[-1]["usage"]["completion_tokens"] == 24
        budget = _budget_tokens(f"http://127.0.0.1:{metrics_port}/metrics")
    finally:
        code = _finish(launcher, signal.SIGINT, lines)
    assert code == 0, "".join(lines)
    settings = EngineSettings(model_path=str(tiny_model_dir), dtype="float32", kv_cache_memory_mb=_KV_MB)
    full = Limits.resolve(settings, load_on_cpu(tiny_model_dir, "float32"))
    assert abs(budget - 2 * full.kv_budget_tokens) <= 2
