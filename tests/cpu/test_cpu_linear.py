"""Prepacked CPU linear layers give the same results as ``nn.Linear`` and replace the right layers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from python_backend.cpu.fused_projections import ProjectionSlice
from python_backend.cpu.linear import PackedLinear, pack_linears, prepack_supported
from python_backend.model.lora import attach_adapters
from tests.fixtures.onednn import BF16_PACKS, PACKED_DTYPES

pytestmark = pytest.mark.skipif(
    not prepack_supported(torch.device("cpu"), torch.float32), reason="this torch build has no oneDNN linear"
)

DTYPES = PACKED_DTYPES


@pytest.mark.parametrize("dtype", DTYPES)
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


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_row_is_the_same_product_whatever_rows_are_beside_it(dtype: torch.dtype) -> None:
    # oneDNN picks its kernel (and so its summation order) by row count, differently on each CPU, so
    # bit-identity across batch sizes holds on no x86 CPU in general. What holds everywhere: each row
    # is its own product, within the dtype's rounding of the exact one, whatever the rows beside it.
    torch.manual_seed(1)
    linear = torch.nn.Linear(576, 1536, bias=False).to(dtype)
    packed = PackedLinear(linear)
    x = torch.randn(33, 576, dtype=dtype)
    weight = linear.weight.detach().double()
    exact = x.double() @ weight.T
    # Rounding the output to the dtype, plus float32 accumulation error (which grows like the square
    # root of the 576 terms): far under the error of a wrong row or a wrong weight (~0.1 and up).
    scale = x.double().abs() @ weight.abs().T
    tolerance = torch.finfo(dtype).eps * exact.abs() + 576**0.5 * torch.finfo(torch.float32).eps * scale
    full = packed(x).double()
    assert ((full - exact).abs() <= tolerance).all()
    for rows in (1, 3, 8, 16):
        part = packed(x[:rows]).double()
        assert part.shape == (rows, 1536)
        assert ((part - exact[:rows]).abs() <= tolerance[:rows]).all()
        assert ((part - full[:rows]).abs() <= 2 * tolerance[:rows]).all()


def test_packed_linear_names_a_wrong_input_dtype() -> None:
    packed = PackedLinear(torch.nn.Linear(8, 4))
    with pytest.raises(TypeError, match="float32 input, got torch.bfloat16"):
        packed(torch.randn(2, 8, dtype=torch.bfloat16))


def test_supported_only_where_onednn_has_kernels() -> None:
    assert prepack_supported(torch.device("cpu"), torch.float32)
    # True on AVX-512 and AMX CPUs; False (and the model keeps nn.Linear) on AVX2-only ones.
    assert prepack_supported(torch.device("cpu"), torch.bfloat16) == BF16_PACKS
    assert not prepack_supported(torch.device("cpu"), torch.float16)
    assert not prepack_supported(torch.device("cuda"), torch.bfloat16)


def _config(model_dir: Path) -> dict:
    return json.loads((model_dir / "config.json").read_text())


@pytest.mark.parametrize("dtype", DTYPES)
def test_pack_linears_replaces_every_decoder_layer_and_the_head(tiny_model_dir: Path, dtype: torch.dtype) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=dtype).eval()
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
    if dtype == torch.bfloat16:
        assert torch.equal(after, before)  # the same oneDNN product, reordered once instead of per call
    else:
        assert torch.allclose(after, before, atol=1e-5, rtol=1e-5)


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
