"""The lean CPU decode step gives exactly the logits of the model's own forward pass, 16/32-bit or quantized."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from python_backend.cpu.quant_linear import QuantLinear
from python_backend.model.loader import LoadedModel
from tests.fixtures.engine_driver import copy_batch, load_on_cpu, running_batch
from tests.fixtures.onednn import BF16_PACK_SKIP
from tests.fixtures.quantized_models import build_quantized


@pytest.mark.parametrize("family", ["qwen2", "llama"])
# The lean step needs prepacked weights, which bfloat16 has only where oneDNN has its kernels.
@pytest.mark.parametrize(
    ("dtype", "kv_cache_dtype"),
    [
        ("float32", "auto"),
        ("float32", "bfloat16"),  # a bfloat16 cache under a float32 model
        pytest.param("bfloat16", "auto", marks=BF16_PACK_SKIP),
    ],
)
def test_fast_decode_logits_equal_the_model_forward(
    family: str, dtype: str, kv_cache_dtype: str, tiny_model_dir: Path, tiny_llama_dir: Path
) -> None:
    loaded = load_on_cpu(tiny_model_dir if family == "qwen2" else tiny_llama_dir, dtype, kv_cache_dtype=kv_cache_dtype)
    _assert_steps_equal_the_model_forward(loaded)


@pytest.mark.parametrize("kind", ["w8a8", "w8a8-static", "w8a16", "w4a16-asym", "int8", "int8+head", "head"])
@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=BF16_PACK_SKIP)])
def test_fast_decode_runs_quantized_products_as_the_model_does(
    kind: str, dtype: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    # A quantized model's lean step calls the same quantized products as its forward pass, the
    # output head's included (--quantize-lm-head, over int8 layers or float ones).
    if kind == "int8":
        loaded = load_on_cpu(tiny_model_dir, dtype, quantization="int8")
    elif kind in ("int8+head", "head"):
        quantization = "int8" if kind == "int8+head" else "none"
        loaded = load_on_cpu(tiny_model_dir, dtype, quantization=quantization, quantize_lm_head=True)
        assert type(loaded.transformers_model.get_output_embeddings()) is QuantLinear
    else:
        loaded = load_on_cpu(build_quantized(tiny_model_dir, tmp_path, kind), dtype)
    _assert_steps_equal_the_model_forward(loaded)


def _assert_steps_equal_the_model_forward(loaded: LoadedModel) -> None:
    fast = loaded.fast_decoder
    assert fast is not None
    prompts = [list(range(3, 40)), list(range(50, 61)), list(range(7, 30, 2))]
    reference_kv = running_batch(loaded, prompts, loaded.kv_dtype)
    fast_kv = copy_batch(reference_kv)
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
    lora = load_on_cpu(tiny_model_dir, "float32", lora_modules=f'{{"tiny-lora": "{tiny_lora_dir}"}}')
    unpacked = load_on_cpu(tiny_model_dir, "float32", cpu_prepack_weights=False)
    assert lora.fast_decoder is None and unpacked.fast_decoder is None
