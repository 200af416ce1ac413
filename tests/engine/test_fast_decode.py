"""The lean CPU decode step gives exactly the logits of the model's own forward pass."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from python_backend.kv_cache import BatchCache, KVBatch
from python_backend.loader import LoadedModel, load_model
from python_backend.settings import EngineSettings


def _load(model_dir: Path, dtype: str, **settings: object) -> LoadedModel:
    return load_model(EngineSettings(model_path=str(model_dir), dtype=dtype, device="cpu", **settings))  # type: ignore[arg-type]


def _running_batch(loaded: LoadedModel, prompts: list[list[int]]) -> KVBatch:
    """Prompts of different lengths prefilled one by one and joined: a left-padded running batch."""
    kv = KVBatch(loaded.kv_dtype)
    with torch.inference_mode():
        for prompt in prompts:
            prefill = BatchCache()
            loaded.model(input_ids=torch.tensor([prompt]), cache=prefill, use_cache=True)
            kv.add(prefill, copies=1)
    return kv


def _copy(kv: KVBatch) -> KVBatch:
    twin = KVBatch(kv.storage_dtype)
    twin.cache = BatchCache(kv.storage_dtype)
    twin.cache.set_layer_states([(k.clone(), v.clone()) for k, v in kv.cache.layer_states()])
    twin.pad = list(kv.pad)
    return twin


@pytest.mark.parametrize("family", ["qwen2", "llama"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fast_decode_logits_equal_the_model_forward(
    family: str, dtype: str, tiny_model_dir: Path, tiny_llama_dir: Path
) -> None:
    loaded = _load(tiny_model_dir if family == "qwen2" else tiny_llama_dir, dtype)
    fast = loaded.fast_decoder
    assert fast is not None
    prompts = [list(range(3, 40)), list(range(50, 61)), list(range(7, 30, 2))]
    reference_kv = _running_batch(loaded, prompts)
    fast_kv = _copy(reference_kv)
    assert reference_kv.padded
    tokens = [[11], [12], [13]]
    with torch.inference_mode():
        for step in range(3):  # consecutive steps: the cache both paths wrote must stay equal too
            ids = torch.tensor(tokens)
            positions = torch.tensor([[len(p) + step] for p in prompts])
            mask = reference_kv.attention_mask(1, torch.device("cpu"))
            expected = loaded.model(
                input_ids=ids, position_ids=positions, attention_mask=mask, cache=reference_kv.cache, use_cache=True
            ).logits[:, -1, :]
            got = fast.logits(ids, positions, fast_kv.cache, fast_kv.attention_mask(1, torch.device("cpu")).bool())
            assert torch.equal(got, expected)
            tokens = expected.argmax(-1, keepdim=True).tolist()


def test_no_fast_decode_with_lora_or_without_prepacked_weights(tiny_model_dir: Path, tiny_lora_dir: Path) -> None:
    lora = _load(tiny_model_dir, "float32", lora_modules=f'{{"tiny-lora": "{tiny_lora_dir}"}}')
    unpacked = _load(tiny_model_dir, "float32", cpu_prepack_weights=False)
    assert lora.fast_decoder is None and unpacked.fast_decoder is None
