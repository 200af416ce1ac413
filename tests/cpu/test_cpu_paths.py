"""The CPU speed paths seen from outside: float32 KV for 16-bit models, and the engine's threads."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from python_backend.cpu.native.attention_kernel import build_kernel
from python_backend.engine.limits import Limits
from python_backend.engine.sequence import EngineEvent, EngineRequest
from python_backend.model.loader import LoadedModel
from python_backend.model.threads import serialize_current_thread
from python_backend.protocol.params import parse_parameters
from python_backend.protocol.settings import EngineSettings
from tests.fixtures.engine_driver import Driver, load_on_cpu, make_engine, running_batch
from tests.fixtures.native import built_or_skip


def _load(model_dir: Path, dtype: str, kv_cache_dtype: str = "auto", native: bool = False) -> LoadedModel:
    return load_on_cpu(model_dir, dtype, kv_cache_dtype=kv_cache_dtype, cpu_native_attention=native)


@pytest.fixture(scope="module")
def bf16_loaded(tiny_model_dir: Path) -> LoadedModel:
    """bfloat16 without the C kernel: the running batch keeps float32 keys and values."""
    return _load(tiny_model_dir, "bfloat16")


@pytest.fixture(scope="module")
def bf16_native(tiny_model_dir: Path) -> LoadedModel:
    built_or_skip(build_kernel())
    return _load(tiny_model_dir, "bfloat16", native=True)


def test_a_bfloat16_model_keeps_float32_keys_and_values_and_budgets_for_them(
    tiny_model_dir: Path, bf16_loaded: LoadedModel, bf16_native: LoadedModel
) -> None:
    as_model = _load(tiny_model_dir, "bfloat16", kv_cache_dtype="model")
    float32 = _load(tiny_model_dir, "float32", native=True)
    assert bf16_loaded.kv_dtype == torch.float32
    # The C kernel reads bfloat16 in place; float32 models never use it.
    assert as_model.kv_dtype is None and float32.kv_dtype is None and bf16_native.kv_dtype is None
    settings = EngineSettings(model_path="unused", kv_cache_memory_mb=64)
    wide = Limits.resolve(settings, bf16_loaded)
    narrow = Limits.resolve(settings, as_model)
    assert wide.kv_bytes_per_token == 2 * narrow.kv_bytes_per_token
    assert wide.kv_budget_tokens * 2 == pytest.approx(narrow.kv_budget_tokens, abs=2)


def _decode_logits(loaded: LoadedModel, kv_dtype: torch.dtype | None, prompt: list[int], token: int) -> torch.Tensor:
    """Next-token logits of one decode step over the running batch's cache, as the engine runs it."""
    kv = running_batch(loaded, [prompt], kv_dtype)
    assert kv.cache.layer_states()[0][0].dtype == (kv_dtype or torch.bfloat16)
    with torch.inference_mode():
        step = loaded.model(
            input_ids=torch.tensor([[token]]),
            position_ids=torch.tensor([[len(prompt)]]),
            cache=kv.cache,
            use_cache=True,
        )
    return step.logits[0, -1].float()


def test_decode_over_a_float32_cache_or_the_kernel_is_at_least_as_close_to_float32(
    tiny_loaded: LoadedModel, bf16_loaded: LoadedModel, bf16_native: LoadedModel
) -> None:
    """Both CPU paths for bfloat16 are no less accurate than bfloat16 matmuls over a bfloat16 cache."""
    prompt = list(range(5, 60, 3))
    token = 77
    with torch.inference_mode():
        reference = tiny_loaded.model(input_ids=torch.tensor([[*prompt, token]])).logits[0, -1].float()
    wide = (_decode_logits(bf16_loaded, torch.float32, prompt, token) - reference).abs().max().item()
    narrow = (_decode_logits(bf16_loaded, None, prompt, token) - reference).abs().max().item()
    native = (_decode_logits(bf16_native, None, prompt, token) - reference).abs().max().item()
    assert wide <= narrow * 1.1
    assert native <= narrow * 1.1


def test_bfloat16_requests_through_the_kernel_finish_with_their_length(bf16_native: LoadedModel) -> None:
    """Padded batches (prompts of different lengths) run through the kernel's masked path."""
    engine = make_engine(bf16_native)
    driver = Driver(engine, bf16_native)
    try:
        prompts = [f"request {i}: " + "the software is provided as is " * (i + 1) for i in range(6)]
        collected = [driver.submit(p, temperature=0, max_tokens=24, ignore_eos=True) for p in prompts]
        peak_batches: list[int] = []
        for c in collected:
            c.wait()
            assert c.error is None and c.last().finish_reason == "length"
            usage = c.last().usage
            assert usage is not None
            assert usage.completion_tokens == 24
            peak_batches.append(max(usage.batch_size))
        assert max(peak_batches) > 1
    finally:
        engine.stop()


def test_the_engine_thread_runs_torch_with_its_own_thread_count(tiny_loaded: LoadedModel) -> None:
    """The loading thread is made serial; the engine thread still computes with the threads asked for."""
    previous = serialize_current_thread()
    seen: list[int] = []
    done = threading.Event()

    def sink(event: EngineEvent) -> None:  # runs on the engine thread
        seen.append(torch.get_num_threads())
        if event.final:
            done.set()

    engine = make_engine(tiny_loaded, torch_threads=2)
    try:
        driver = Driver(engine, tiny_loaded)
        parsed = parse_parameters({"temperature": 0, "max_tokens": 4, "ignore_eos": True}, stream=True)
        engine.submit(EngineRequest("threads", driver.prompt_ids("hello"), parsed, sink))
        assert done.wait(60)
        assert torch.get_num_threads() == 1
        assert seen and set(seen) == {2}
    finally:
        engine.stop()
        torch.set_num_threads(previous)
