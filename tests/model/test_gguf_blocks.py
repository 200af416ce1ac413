"""``--quantization gguf``: a GGUF file's own Q4_0/Q4_1 blocks, kept by the conversion and served as
4-bit ``QuantLinear`` layers (python_backend/model/gguf_blocks.py, openai_frontend/launcher/demo_model.py).

Offline and small: tiny GGUF files are written with the ``gguf`` package's own writer and
quantizer, and the tiny Llama model is turned into a folder "converted from a GGUF file" whose
weights are the blocks widened, as the demo model's are.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize
from safetensors.torch import load_file, save_file
from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

from openai_frontend.launcher import demo_model
from openai_frontend.launcher.cli import parse_serve_args
from python_backend.cpu.linear import prepack_supported
from python_backend.cpu.quant_linear import QuantLinear, QuantWeight, concat_weights
from python_backend.model.gguf_blocks import BLOCKS_FILE, decode_blocks
from python_backend.model.loader import LoadedModel, ModelLoadError, load_model
from python_backend.model.quantization import QuantizationError, plan_quantization
from python_backend.protocol.settings import EngineSettings

Q4_0, Q4_1 = GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1
HEADS, KV_HEADS = 4, 2  # the tiny Llama model's
DOCS = Path(__file__).resolve().parents[2] / "docs" / "quantization.md"


def _llama_cpp_permute(rows: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter's reordering of a Llama q/k projection's rows (its rotary layout)."""
    return rows.reshape(heads, 2, rows.shape[0] // heads // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def _transformers_unpermute(weights: np.ndarray, gguf_name: str) -> np.ndarray:
    """What transformers does to a GGUF Llama tensor when it loads the file."""
    processor = LlamaTensorProcessor(config={"num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS})
    return np.asarray(processor.process(weights, gguf_name).weights)


def _write_gguf(path: Path, tensors: dict[str, tuple[np.ndarray, GGMLQuantizationType]]) -> None:
    writer = GGUFWriter(str(path), "llama")
    for name, (data, kind) in tensors.items():
        writer.add_tensor(name, data, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _random(rows: int, cols: int, seed: int) -> np.ndarray:
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)).numpy()


def test_blocks_decode_as_gguf_dequantizes_them_with_q_and_k_rows_in_transformers_order(tmp_path: Path) -> None:
    quantized = {
        "blk.0.attn_q.weight": (quantize(_random(64, 96, 1), Q4_1), Q4_1),
        "blk.0.attn_k.weight": (quantize(_random(32, 96, 2), Q4_0), Q4_0),
        "blk.0.attn_v.weight": (quantize(_random(32, 96, 3), Q4_0), Q4_0),
        "blk.1.ffn_down.weight": (quantize(_random(96, 128, 4), Q4_1), Q4_1),
        # Not 4-bit blocks, or not a decoder linear layer: left out of the blocks file.
        "blk.0.ffn_up.weight": (quantize(_random(128, 96, 5), GGMLQuantizationType.Q8_0), GGMLQuantizationType.Q8_0),
        "blk.0.attn_norm.weight": (_random(1, 96, 6)[0], GGMLQuantizationType.F32),
    }
    gguf = tmp_path / "tiny.gguf"
    _write_gguf(gguf, quantized)
    blocks = demo_model.read_gguf_blocks(gguf, HEADS, KV_HEADS, permuted=True)
    assert sorted(blocks) == [
        "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.v_proj.weight",
        "model.layers.1.mlp.down_proj.weight",
    ]
    for gguf_name, hf_name in (
        ("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight"),
        ("blk.0.attn_k.weight", "model.layers.0.self_attn.k_proj.weight"),
        ("blk.0.attn_v.weight", "model.layers.0.self_attn.v_proj.weight"),
        ("blk.1.ffn_down.weight", "model.layers.1.mlp.down_proj.weight"),
    ):
        data, kind = quantized[gguf_name]
        expected = _transformers_unpermute(dequantize(data, kind), gguf_name)
        ggml_type, raw = blocks[hf_name]
        assert (
            ggml_type == kind.name
            and raw.dtype == np.uint8
            and raw.shape[1:] == (data.shape[1] // raw.shape[2], raw.shape[2])
        )
        weight = decode_blocks(hf_name, ggml_type, torch.from_numpy(raw))
        assert (weight.bits, weight.group_size, weight.activations, weight.zero) == (4, 32, "none", None)
        assert int(weight.values.min()) >= -8 and int(weight.values.max()) <= 7
        assert (weight.offset is None) == (kind == Q4_0)
        torch.testing.assert_close(weight.dequantized(torch.float32), torch.from_numpy(expected), rtol=1e-6, atol=1e-6)


def test_the_blocks_file_is_named_as_the_loader_reads_it() -> None:
    assert demo_model.GGUF_BLOCKS_NAME == BLOCKS_FILE


def _q4_weight(rows: int, cols: int, kind: GGMLQuantizationType, seed: int) -> QuantWeight:
    raw = quantize(_random(rows, cols, seed), kind)
    return decode_blocks("w", kind.name, torch.from_numpy(raw).reshape(rows, cols // 32, -1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_offset_levels_multiply_as_their_float_weight_in_each_kernel(dtype: torch.dtype) -> None:
    q4_1, q4_0 = _q4_weight(48, 128, Q4_1, 7), _q4_weight(32, 128, Q4_0, 8)
    merged = concat_weights([q4_1, q4_0])
    assert merged is not None and merged.offset is not None
    torch.testing.assert_close(
        merged.dequantized(torch.float32), torch.cat([q4_1.dequantized(torch.float32), q4_0.dequantized(torch.float32)])
    )
    # Groups of 16 are no int4pack size: the same levels then run the dequantizing product.
    offset = merged.offset.repeat_interleave(2, 1)
    halves = QuantWeight(merged.values, merged.scale.repeat_interleave(2, 1), None, 4, 16, "none", offset=offset)
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(9)).to(dtype)
    for weight, kernel in ((merged, "int4pack"), (halves, "dequant")):
        layer = QuantLinear(weight, None, dtype, torch.device("cpu"))
        assert layer.kernel == kernel
        expected = x.float() @ weight.dequantized(torch.float32).t()
        tolerance = 1e-4 if dtype == torch.float32 else 0.05 * float(expected.abs().max())
        torch.testing.assert_close(layer(x).float(), expected, rtol=0.02, atol=tolerance)


def test_an_offset_needs_weight_only_levels() -> None:
    weight = _q4_weight(32, 64, Q4_1, 10)
    with pytest.raises(ValueError, match="offset"):
        QuantWeight(weight.values, weight.scale, None, 4, 32, "dynamic", offset=weight.offset)


# --- a tiny folder converted from a GGUF file --------------------------------------------------------


def build_gguf_folder(source: Path, target: Path) -> Path:
    """``source`` (the tiny Llama folder) as if converted from a GGUF file: its decoder's linear
    weights quantized to Q4_1 (v and down: Q4_0) in a GGUF file laid out as llama.cpp writes one,
    the folder's weights replaced by those blocks widened, and the blocks file written."""
    shutil.copytree(source, target)
    weights = load_file(str(target / "model.safetensors"))
    tensors: dict[str, tuple[np.ndarray, GGMLQuantizationType]] = {}
    layers = json.loads((target / "config.json").read_text())["num_hidden_layers"]
    for layer in range(layers):
        for gguf_part, hf_part in demo_model.GGUF_LINEAR_NAMES.items():
            hf_name, gguf_name = f"model.layers.{layer}.{hf_part}.weight", f"blk.{layer}.{gguf_part}.weight"
            rows = weights[hf_name].float().numpy()
            if gguf_part in ("attn_q", "attn_k"):
                rows = _llama_cpp_permute(rows, HEADS if gguf_part == "attn_q" else KV_HEADS)
            kind = Q4_0 if gguf_part in ("attn_v", "ffn_down") else Q4_1
            tensors[gguf_name] = (quantize(np.ascontiguousarray(rows), kind), kind)
            widened = _transformers_unpermute(dequantize(*tensors[gguf_name]), gguf_name)
            weights[hf_name] = torch.from_numpy(np.ascontiguousarray(widened)).to(weights[hf_name].dtype)
    save_file(weights, str(target / "model.safetensors"), metadata={"format": "pt"})
    gguf = target.parent / f"{target.name}.gguf"
    _write_gguf(gguf, tensors)
    blocks = demo_model.read_gguf_blocks(gguf, HEADS, KV_HEADS, permuted=True)
    demo_model.save_gguf_blocks(blocks, target / demo_model.GGUF_BLOCKS_NAME)
    return target


@pytest.fixture(scope="module")
def gguf_dir(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_gguf_folder(tiny_llama_dir, tmp_path_factory.mktemp("tiny-gguf") / "tiny")


def _load(folder: Path, **values: Any) -> LoadedModel:
    values.setdefault("dtype", "float32")
    return load_model(EngineSettings(model_path=str(folder), device="cpu", **values))


def _quant_layers(loaded: LoadedModel) -> list[QuantLinear]:
    decoder = loaded.transformers_model.get_decoder()
    return list({id(m): m for m in decoder.modules() if type(m) is QuantLinear}.values())


def _logits(loaded: LoadedModel, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return loaded.model(ids).logits.float()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gguf_folder_serves_its_blocks_as_4bit_layers_that_agree_with_its_widened_weights(
    gguf_dir: Path, dtype: str
) -> None:
    ids = torch.randint(0, 2000, (2, 40), generator=torch.Generator().manual_seed(3))
    widened = _load(gguf_dir, dtype=dtype)
    assert not _quant_layers(widened)
    loaded = _load(gguf_dir, dtype=dtype, quantization="gguf")
    layers = _quant_layers(loaded)
    # 2 layers x (merged q/k/v, o, merged gate/up, down), each the 4-bit CPU kernel.
    assert len(layers) == 8 and {(layer.kernel, layer.group_size) for layer in layers} == {("int4pack", 32)}
    decoder = loaded.transformers_model.get_decoder()
    assert not [name for name, m in decoder.named_modules() if type(m) is torch.nn.Linear]
    dense = sum(layer.in_features * layer.out_features * (4 if dtype == "float32" else 2) for layer in layers)
    assert sum(layer.weight_bytes() for layer in layers) <= dense * (0.2 if dtype == "float32" else 0.32)
    # The lean decode step runs the 4-bit products, where this CPU prepacks the dtype's other layers
    # (bfloat16 needs oneDNN's bfloat16 kernels: not on AVX2-only CPUs, where float32 is served).
    assert (loaded.fast_decoder is not None) == prepack_supported(torch.device("cpu"), getattr(torch, dtype))
    expected, got = _logits(widened, ids), _logits(loaded, ids)
    if dtype == "float32":
        # The same weights up to float rounding: the logits agree to float precision.
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    else:
        assert float((got - expected).abs().mean()) < 0.05 * float(expected.abs().mean())
        assert float((got.argmax(-1) == expected.argmax(-1)).float().mean()) >= 0.9


def test_gguf_needs_a_folder_with_blocks(tiny_llama_dir: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"quantization 'gguf' needs a folder converted from a GGUF file "
                       r"\(the demo model\); .* has no gguf-blocks/blocks\.safetensors"):  # fmt: skip
        _load(tiny_llama_dir, quantization="gguf")


def test_gguf_refuses_what_quantized_models_refuse(gguf_dir: Path, tiny_lora_dir: Path) -> None:
    with pytest.raises(ModelLoadError, match="quantization .* lora_modules or batch_invariant"):
        _load(gguf_dir, quantization="gguf", lora_modules=json.dumps({"a": str(tiny_lora_dir)}))
    with pytest.raises(ModelLoadError, match="quantization .* lora_modules or batch_invariant"):
        _load(gguf_dir, quantization="gguf", batch_invariant=True)
    with pytest.raises(QuantizationError, match="quantization 'gguf' needs a 16/32-bit folder"):
        plan_quantization("gguf", {"quantization_config": {"quant_method": "compressed-tensors"}})


def _edited_blocks(gguf_dir: Path, target: Path, edit: Any) -> Path:
    shutil.copytree(gguf_dir, target)
    path = target / BLOCKS_FILE
    tensors = load_file(str(path))
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        metadata = dict(handle.metadata())
    edit(tensors, metadata)
    save_file(tensors, str(path), metadata=metadata)
    return target


@pytest.mark.parametrize(("edit", "message"), [
    (lambda t, m: m.update({"model.layers.0.mlp.up_proj.weight": "Q8_0"}),
     "model.layers.0.mlp.up_proj.weight: GGML type 'Q8_0' is not supported"),
    (lambda t, m: (t.update({"model.embed_tokens.weight": t["model.layers.0.mlp.up_proj.weight"].clone()}),
                   m.update({"model.embed_tokens.weight": "Q4_1"})),
     "holds 'model.embed_tokens.weight', which is no linear layer"),
    (lambda t, m: t.update({"model.layers.0.mlp.up_proj.weight": t["model.layers.0.mlp.down_proj.weight"].clone()}),
     "model.layers.0.mlp.up_proj.weight: Q4_1 blocks must be uint8"),
])  # fmt: skip
def test_a_bad_blocks_file_names_the_tensor(gguf_dir: Path, tmp_path: Path, edit: Any, message: str) -> None:
    folder = _edited_blocks(gguf_dir, tmp_path / "edited", edit)
    with pytest.raises(ModelLoadError, match=re.escape(message)):
        _load(folder, quantization="gguf")


def test_the_flag_and_the_pages_command_parse(tmp_path: Path) -> None:
    options = parse_serve_args(["serve", "--model", str(tmp_path), "--quantization", "gguf"])
    assert options.engine_flags["quantization"] == "gguf"
    page = DOCS.read_text(encoding="utf-8")
    section = page[page.index("## Ascend and GGUF") :]
    commands = [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", section) if "--quantization gguf" in span]
    assert commands == ["triton-chat serve --quantization gguf"]
    options = parse_serve_args(shlex.split(commands[0])[1:])
    assert options.model is None and options.engine_flags["quantization"] == "gguf"  # the demo model
