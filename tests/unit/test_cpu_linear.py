"""Prepacked CPU linear layers give the same results as ``nn.Linear`` and replace the right layers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from python_backend.cpu_linear import PackedLinear, pack_linears, prepack_supported
from python_backend.fused_projections import ProjectionSlice
from python_backend.lora import attach_adapters

pytestmark = pytest.mark.skipif(
    not prepack_supported(torch.device("cpu"), torch.float32), reason="this torch build has no oneDNN linear"
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_matches_linear(dtype: torch.dtype, bias: bool) -> None:
    torch.manual_seed(0)
    linear = torch.nn.Linear(48, 80, bias=bias).to(dtype)
    packed = PackedLinear(linear)
    for shape in [(1, 48), (7, 48), (3, 5, 48), (300, 48)]:
        x = torch.randn(shape, dtype=dtype)
        expected, got = linear(x), packed(x)
        assert got.shape == expected.shape and got.dtype == dtype
        if dtype == torch.bfloat16:
            # PyTorch's own bfloat16 linear is this oneDNN product with the reorder done per call.
            assert torch.equal(got, expected)
        else:
            assert torch.allclose(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_row_does_not_depend_on_the_rows_beside_it(dtype: torch.dtype) -> None:
    torch.manual_seed(1)
    packed = PackedLinear(torch.nn.Linear(576, 1536, bias=False).to(dtype))
    x = torch.randn(33, 576, dtype=dtype)
    full = packed(x)
    for rows in (1, 3, 8, 16):
        assert torch.equal(packed(x[:rows]), full[:rows])


def test_packed_linear_names_a_wrong_input_dtype() -> None:
    packed = PackedLinear(torch.nn.Linear(8, 4).to(torch.bfloat16))
    with pytest.raises(TypeError, match="bfloat16 input, got torch.float32"):
        packed(torch.randn(2, 8))


def test_supported_only_on_cpu_for_float32_and_bfloat16() -> None:
    assert prepack_supported(torch.device("cpu"), torch.bfloat16)
    assert not prepack_supported(torch.device("cpu"), torch.float16)
    assert not prepack_supported(torch.device("cuda"), torch.bfloat16)


def _config(model_dir: Path) -> dict:
    return json.loads((model_dir / "config.json").read_text())


def test_pack_linears_replaces_every_decoder_layer_and_the_head(tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16).eval()
    ids = torch.tensor([[5, 17, 42, 8, 99, 3]])
    with torch.inference_mode():
        before = model(input_ids=ids).logits
    replaced = pack_linears(model, model.get_decoder(), model.get_output_embeddings())
    layers = _config(tiny_model_dir)["num_hidden_layers"]
    assert replaced == 7 * layers + 1  # q, k, v, o, gate, up, down per layer, and lm_head
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    attention = model.get_decoder().layers[0].self_attn
    assert {type(attention.q_proj), type(attention.k_proj), type(attention.v_proj)} == {ProjectionSlice}
    assert attention.q_proj.group is attention.v_proj.group  # one product for q, k and v
    assert isinstance(model.get_input_embeddings(), torch.nn.Embedding)  # a tied head keeps its embedding
    with torch.inference_mode():
        after = model(input_ids=ids).logits
    assert torch.equal(after, before)


def test_layers_wrapped_by_lora_keep_their_linear(tiny_model_dir: Path, tiny_lora_dir: Path) -> None:
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    model = attach_adapters(base, {"tiny-lora": str(tiny_lora_dir)})
    ids = torch.tensor([[5, 17, 42, 8, 99, 3]])
    with torch.inference_mode():
        before = model(input_ids=ids).logits
    replaced = pack_linears(model, base.get_decoder(), base.get_output_embeddings())
    wrapped = [m for m in model.modules() if hasattr(m, "base_layer")]
    assert wrapped and all(type(m.base_layer) is torch.nn.Linear for m in wrapped)
    assert 0 < replaced < 7 * _config(tiny_model_dir)["num_hidden_layers"] + 1
    with torch.inference_mode():
        after = model(input_ids=ids).logits
    assert torch.allclose(after, before, atol=1e-4, rtol=1e-4)
