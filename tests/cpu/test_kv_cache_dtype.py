"""``--kv-cache-dtype bfloat16``: a float32 model's keys and values stored in bfloat16 on CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from python_backend.cpu.native.attention_kernel import build_kernel
from python_backend.engine.batch_cache import BatchCache
from python_backend.engine.kv_cache import KVBatch
from python_backend.engine.limits import Limits
from python_backend.model.loader import LoadedModel, ModelLoadError
from python_backend.protocol.settings import EngineSettings, SettingsError
from tests.fixtures.device import engine_test_device
from tests.fixtures.engine_driver import Driver, load_on_cpu, make_engine
from tests.fixtures.native import built_or_skip
from tests.fixtures.quantized_models import build_quantized

pytestmark = pytest.mark.skipif(engine_test_device() != "cpu", reason="kv_cache_dtype bfloat16 is a CPU setting")


@pytest.fixture(scope="module")
def narrow(tiny_model_dir: Path) -> LoadedModel:
    built_or_skip(build_kernel())
    return load_on_cpu(tiny_model_dir, "float32", kv_cache_dtype="bfloat16")


def test_a_float32_model_stores_bfloat16_and_budgets_twice_the_tokens(
    narrow: LoadedModel, tiny_loaded: LoadedModel
) -> None:
    assert narrow.dtype == torch.float32
    assert narrow.kv_dtype == narrow.prompt_kv_dtype == torch.bfloat16
    assert tiny_loaded.prompt_kv_dtype == torch.float32
    settings = EngineSettings(model_path="unused", kv_cache_memory_mb=64, prefix_cache_memory_mb=16)
    half, full = Limits.resolve(settings, narrow), Limits.resolve(settings, tiny_loaded)
    assert full.kv_bytes_per_token == 2 * half.kv_bytes_per_token
    assert half.kv_budget_tokens == pytest.approx(2 * full.kv_budget_tokens, abs=2)
    assert half.prefix_cache_tokens == pytest.approx(2 * full.prefix_cache_tokens, abs=2)
    # A cold prefill's cache, filled by the model's forward, stores bfloat16 from its first token.
    prefill = BatchCache(narrow.prompt_kv_dtype)
    with torch.inference_mode():
        narrow.model(input_ids=torch.tensor([list(range(5, 40))]), cache=prefill, use_cache=True)
    assert {keys.dtype for keys, _ in prefill.layer_states()} == {torch.bfloat16}


def _decode_error(loaded: LoadedModel, reference: torch.Tensor, prompt: list[int], token: int) -> float:
    """Largest logit error of one decode step after a prefill, both in the model's own caches."""
    with torch.inference_mode():
        prefill = BatchCache(loaded.prompt_kv_dtype)
        loaded.model(input_ids=torch.tensor([prompt]), cache=prefill, use_cache=True)
        kv = KVBatch(loaded.kv_dtype)
        kv.add_states(KVBatch.row_states(prefill, 0), copies=1)
        assert kv.cache.layer_states()[0][0].dtype == (loaded.kv_dtype or loaded.dtype)
        step = loaded.model(
            input_ids=torch.tensor([[token]]), position_ids=torch.tensor([[len(prompt)]]), cache=kv.cache
        )
    return float((step.logits[0, -1].float() - reference).abs().max())


def test_decode_over_a_bfloat16_cache_is_closer_to_float32_than_a_bfloat16_model(
    tiny_model_dir: Path, narrow: LoadedModel, tiny_loaded: LoadedModel
) -> None:
    """Rounding only the cache costs less than rounding the weights too, and is not nothing."""
    prompt, token = list(range(5, 80, 3)), 77
    with torch.inference_mode():
        reference = tiny_loaded.model(input_ids=torch.tensor([[*prompt, token]])).logits[0, -1].float()
    bf16_model = load_on_cpu(tiny_model_dir, "bfloat16", cpu_native_attention=True)
    narrowed = _decode_error(narrow, reference, prompt, token)
    assert 0 < narrowed < _decode_error(bf16_model, reference, prompt, token)


def test_requests_finish_and_a_second_turn_reuses_the_bfloat16_prefix(narrow: LoadedModel) -> None:
    """Padded batches go through the kernel's bfloat16 variant; finished answers enter the prefix
    cache in bfloat16 and a conversation's next turn starts from them."""
    engine = make_engine(narrow, prefix_cache_memory_mb=16)
    driver = Driver(engine, narrow)
    try:
        prompts = [f"request {i}: " + "the software is provided as is " * (i + 1) for i in range(5)]
        runs = [driver.submit(p, temperature=0, max_tokens=20, ignore_eos=True) for p in prompts]
        for run in runs:
            run.wait()
            assert run.error is None and run.last().finish_reason == "length"
            assert run.usage().completion_tokens == 20
        assert max(max(run.usage().batch_size) for run in runs) > 1
        history = [{"role": "user", "content": prompts[0]}, {"role": "assistant", "content": runs[0].text()}]
        driver.wait_idle()
        # What the prefix cache kept is bfloat16: half a float32 token's bytes.
        stats = engine.stats()
        assert stats.prefix_cache_tokens > 0
        per_token = Limits.resolve(EngineSettings(model_path="unused"), narrow).kv_bytes_per_token
        assert stats.prefix_cache_bytes == stats.prefix_cache_tokens * per_token
        follow_up = driver.submit("and then?", history=history, temperature=0, max_tokens=8).wait()
        assert follow_up.error is None
        assert follow_up.usage().cached_tokens > 0
    finally:
        engine.stop()


def test_the_setting_is_refused_where_it_cannot_work(tiny_model_dir: Path) -> None:
    with pytest.raises(SettingsError, match="kv_cache_dtype bfloat16 does not run with batch_invariant"):
        EngineSettings(kv_cache_dtype="bfloat16", batch_invariant=True)
    with pytest.raises(ModelLoadError, match="kv_cache_dtype 'bfloat16' needs a float32 or bfloat16 model"):
        load_on_cpu(tiny_model_dir, "float16", kv_cache_dtype="bfloat16")


def test_auto_keeps_bfloat16_keys_under_w8a8_layers_only(tiny_model_dir: Path, tmp_path: Path) -> None:
    # W8A8 rounds every product's input to 8 bits; bfloat16 keys cost nothing measurable on top.
    built_or_skip(build_kernel())
    int8 = load_on_cpu(tiny_model_dir, "float32", quantization="int8")
    assert int8.kv_dtype == int8.prompt_kv_dtype == torch.bfloat16
    folder = build_quantized(tiny_model_dir, tmp_path, "w8a8")
    assert load_on_cpu(folder, "float32").kv_dtype == torch.bfloat16
    # Asked for the model's dtype, or float32 products, or weight-only int8: float32 keys.
    assert load_on_cpu(tiny_model_dir, "float32", quantization="int8", kv_cache_dtype="model").kv_dtype is None
    assert load_on_cpu(tiny_model_dir, "float32").kv_dtype is None
    assert load_on_cpu(build_quantized(tiny_model_dir, tmp_path, "w8a16"), "float32").kv_dtype is None
    # A bfloat16 model's W8A8 layers keep its own bfloat16 cache.
    assert load_on_cpu(tiny_model_dir, "bfloat16", quantization="int8").kv_dtype is None


def test_a_bfloat16_model_keeps_its_own_cache(tiny_model_dir: Path) -> None:
    loaded = load_on_cpu(tiny_model_dir, "bfloat16", kv_cache_dtype="bfloat16")
    assert loaded.kv_dtype is None and loaded.prompt_kv_dtype == torch.bfloat16
