"""Quantized folders and ``--quantization`` through ``load_model``: compressed-tensors W8A8 (dynamic
and static activations), W8A16 and W4A16 (symmetric and asymmetric) folders written offline from the
tiny model, and int8 made at load time. Each keeps its weights quantized, agrees with the float
model as far as its bits allow, and a bad ``quantization_config`` is refused naming the field."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from python_backend.cpu.fused_projections import ProjectionSlice
from python_backend.cpu.int8_gemm import build_int8_gemm
from python_backend.cpu.quant_linear import QuantLinear
from python_backend.model.loader import LoadedModel, ModelLoadError, load_model
from python_backend.protocol.settings import EngineSettings
from tests.fixtures.quantized_models import build_quantized

KINDS = ("w8a8", "w8a8-static", "w8a16", "w4a16", "w4a16-asym")


@pytest.fixture(scope="module")
def quantized_dirs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {kind: build_quantized(tiny_model_dir, tmp_path_factory.mktemp(kind), kind) for kind in KINDS}


@pytest.fixture(scope="module")
def prompt_ids() -> torch.Tensor:
    return torch.randint(0, 2000, (2, 48), generator=torch.Generator().manual_seed(7))


def _load(folder: Path, **values: Any) -> LoadedModel:
    return load_model(EngineSettings(model_path=str(folder), dtype="float32", device="cpu", **values))


def _logits(loaded: LoadedModel, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return loaded.model(ids).logits.float()


def _w8a8_kernel() -> str:
    """What W8A8 layers run on this CPU: our int8 product with AVX512-VNNI, else torch._int_mm."""
    return "int8_gemm" if build_int8_gemm() is not None else "int_mm"


def _quant_layers(loaded: LoadedModel) -> list[QuantLinear]:
    decoder = loaded.transformers_model.get_decoder()
    layers = {id(m): m for m in decoder.modules() if type(m) is QuantLinear}
    return list(layers.values())


def _assert_held_quantized(loaded: LoadedModel, bits: int) -> None:
    layers = _quant_layers(loaded)
    # 2 layers x (merged q/k/v, o, merged gate/up, down)
    assert len(layers) == 8
    decoder = loaded.transformers_model.get_decoder()
    assert not [n for n, m in decoder.named_modules() if type(m) is torch.nn.Linear]
    float_bytes = sum(layer.in_features * layer.out_features * 4 for layer in layers)
    held = sum(layer.weight_bytes() for layer in layers)
    # int8: a quarter of float32, plus a scale per channel; 4-bit: an eighth, plus a float32 scale
    # and offset per group of 32 (another sixteenth).
    assert held <= float_bytes * (1 / 4 + 1 / 32 if bits == 8 else 1 / 8 + 1 / 16), (held, float_bytes)
    assert all(layer.bits == bits for layer in layers)
    attention = decoder.layers[0].self_attn
    assert type(attention.q_proj) is ProjectionSlice and type(attention.q_proj.group.product) is QuantLinear
    assert loaded.fast_decoder is not None  # the lean step runs the quantized products too


def test_w8a8_folder_loads_int8_and_agrees_with_the_float_model(
    tiny_model_dir: Path, quantized_dirs: dict[str, Path], prompt_ids: torch.Tensor
) -> None:
    expected = _logits(_load(tiny_model_dir), prompt_ids)
    loaded = _load(quantized_dirs["w8a8"])
    _assert_held_quantized(loaded, 8)
    assert {layer.kernel for layer in _quant_layers(loaded)} == {_w8a8_kernel()}
    got = _logits(loaded, prompt_ids)
    # Measured on the tiny random model: max |diff| ~0.5 on logits spanning ~14, top-1 the same on
    # ~85 % of positions (its logits are nearly tied, so int8's ~1 % error flips some).
    assert float((got - expected).abs().max()) < 1.0
    assert float((got - expected).abs().mean()) < 0.1
    assert float((got.argmax(-1) == expected.argmax(-1)).float().mean()) >= 0.7


def test_load_time_int8_agrees_with_the_float_model(tiny_model_dir: Path, prompt_ids: torch.Tensor) -> None:
    expected = _logits(_load(tiny_model_dir), prompt_ids)
    loaded = _load(tiny_model_dir, quantization="int8")
    _assert_held_quantized(loaded, 8)
    got = _logits(loaded, prompt_ids)
    assert float((got - expected).abs().mean()) < 0.1
    assert float((got.argmax(-1) == expected.argmax(-1)).float().mean()) >= 0.7


def _library_dequantized(source: Path, folder: Path, ids: torch.Tensor) -> torch.Tensor:
    """What the folder's tensors mean, by compressed-tensors' own unpacking and dequantization,
    without our loader: the float model with every tensor taken from the folder."""
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
    from compressed_tensors.quantization import QuantizationConfig
    from compressed_tensors.quantization.lifecycle.forward import dequantize
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    args = (
        QuantizationConfig.model_validate(json.loads((folder / "config.json").read_text())["quantization_config"])
        .config_groups["group_0"]
        .weights
    )
    tensors = load_file(str(folder / "model.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32, local_files_only=True)
    state = {}
    for key, value in tensors.items():
        if key.endswith(".weight_packed"):
            name = key.removesuffix(".weight_packed")
            shape = torch.Size(tensors[f"{name}.weight_shape"].tolist())
            scale = tensors[f"{name}.weight_scale"].float()  # dequantized in float32, as our kernels compute
            zero = tensors.get(f"{name}.weight_zero_point")
            if zero is not None:
                zero = unpack_from_int32(zero, args.num_bits, scale.shape, packed_dim=0)
            levels = unpack_from_int32(value, args.num_bits, shape)
            state[f"{name}.weight"] = dequantize(x_q=levels, scale=scale, zero_point=zero, args=args).float()
        elif not key.endswith((".weight_scale", ".weight_shape", ".weight_zero_point")):
            state[key] = value.float()
    model.load_state_dict(state, strict=False)
    with torch.inference_mode():
        return model(ids).logits.float()


@pytest.mark.parametrize(("kind", "bits", "kernel"), [
    ("w8a8-static", 8, "int_mm"), ("w8a16", 8, "int8pack"), ("w4a16", 4, "int4pack"), ("w4a16-asym", 4, "int4pack"),
])  # fmt: skip
def test_folder_runs_its_kernel_on_its_weights(
    kind: str, bits: int, kernel: str, tiny_model_dir: Path, quantized_dirs: dict[str, Path], prompt_ids: torch.Tensor
) -> None:
    loaded = _load(quantized_dirs[kind])
    _assert_held_quantized(loaded, bits)
    layers = _quant_layers(loaded)
    assert {layer.kernel for layer in layers} == {_w8a8_kernel() if kernel == "int_mm" else kernel}
    assert all(layer.asymmetric == kind.endswith("-asym") for layer in layers)
    got = _logits(loaded, prompt_ids)
    if kind.startswith("w4a16"):
        # Weight-only: the kernels reproduce the library's own dequantized model to float rounding.
        expected = _library_dequantized(tiny_model_dir, quantized_dirs[kind], prompt_ids)
        assert float((got - expected).abs().max()) < 1e-3
    else:
        # Against the float model, as far as 8 bits allow (static activations clip a few inputs).
        expected = _logits(_load(tiny_model_dir), prompt_ids)
        assert float((got - expected).abs().mean()) < (0.1 if kind == "w8a16" else 1.0)


def _with_config(source: Path, target: Path, edit: Any) -> Path:
    shutil.copytree(source, target)
    config = json.loads((target / "config.json").read_text())
    edit(config["quantization_config"])
    (target / "config.json").write_text(json.dumps(config))
    return target


@pytest.mark.parametrize(("edit", "field"), [
    (lambda q: q["config_groups"]["group_0"]["weights"].update(num_bits=3), "config_groups.group_0.weights"),
    (lambda q: q.update(quant_method="awq"), "quantization_config.quant_method 'awq'"),
    (lambda q: q["config_groups"]["group_0"]["weights"].update(strategy="block"), "group_0.weights"),
    (lambda q: q["config_groups"]["group_0"]["input_activations"].update(type="float"), "input_activations"),
    (lambda q: q.update(format="nvfp4-pack-quantized"), "quantization_config.format"),
])  # fmt: skip
def test_bad_quantization_config_names_the_field(
    edit: Any, field: str, quantized_dirs: dict[str, Path], tmp_path: Path
) -> None:
    folder = _with_config(quantized_dirs["w8a8"], tmp_path / "bad", edit)
    with pytest.raises(ModelLoadError, match="quantization_config") as caught:
        _load(folder)
    assert field in str(caught.value)


@pytest.mark.parametrize("quantization", ["int8", "none"])
def test_quantize_lm_head_makes_the_head_w8a8_and_keeps_the_embeddings(
    tiny_model_dir: Path, prompt_ids: torch.Tensor, quantization: str
) -> None:
    reference = _load(tiny_model_dir, quantization=quantization)
    loaded = _load(tiny_model_dir, quantization=quantization, quantize_lm_head=True)
    base = loaded.transformers_model
    head = base.get_output_embeddings()
    assert isinstance(head, QuantLinear) and head.bits == 8 and head.kernel == _w8a8_kernel()
    assert head.static_input_scale is None  # per-token dynamic activations
    # The tiny model ties its head to the embeddings: the lookup keeps the float weight, and the
    # head holds int8 levels of it (a quarter of its bytes, and a scale and sum per channel: under a
    # third at the tiny model's 64 columns).
    embeddings = base.get_input_embeddings().weight
    assert isinstance(embeddings, torch.Tensor) and embeddings.dtype == torch.float32
    unchanged = reference.transformers_model.get_input_embeddings().weight
    assert isinstance(unchanged, torch.Tensor) and torch.equal(embeddings, unchanged)
    assert head.weight_bytes() < embeddings.numel() * embeddings.element_size() / 3
    with torch.inference_mode():
        rows = torch.randn(4, embeddings.shape[1], generator=torch.Generator().manual_seed(3))
        exact = rows @ embeddings.T
        error = (head(rows) - exact).abs().mean() / exact.abs().mean()
    assert 0 < float(error) < 0.02  # int8 weights and activations: about 1 % of the product
    assert len(_quant_layers(loaded)) == len(_quant_layers(reference))  # the decoder as --quantization says
    expected, got = _logits(reference, prompt_ids), _logits(loaded, prompt_ids)
    assert not torch.equal(got, expected)
    assert float((got - expected).abs().mean()) < 0.1
    assert float((got.argmax(-1) == expected.argmax(-1)).float().mean()) >= 0.7


def test_quantize_lm_head_is_refused_where_quantization_is(tiny_model_dir: Path, tiny_lora_dir: Path) -> None:
    with pytest.raises(ModelLoadError, match="quantize_lm_head .* lora_modules"):
        _load(tiny_model_dir, quantize_lm_head=True, lora_modules=json.dumps({"a": str(tiny_lora_dir)}))


def test_none_and_int8_refuse_a_quantized_folder(quantized_dirs: dict[str, Path]) -> None:
    for value in ("none", "int8"):
        with pytest.raises(ModelLoadError, match=f"quantization '{value}' needs a 16/32-bit folder"):
            _load(quantized_dirs["w8a8"], quantization=value)


def test_quantization_refuses_lora_and_batch_invariant(tiny_model_dir: Path, tiny_lora_dir: Path) -> None:
    with pytest.raises(ModelLoadError, match="quantization .* lora_modules"):
        _load(tiny_model_dir, quantization="int8", lora_modules=json.dumps({"a": str(tiny_lora_dir)}))


def test_unquantized_folder_loads_unchanged_under_auto(tiny_model_dir: Path) -> None:
    assert not _quant_layers(_load(tiny_model_dir))


def test_the_pages_serve_commands_parse_as_written(tmp_path: Path) -> None:
    import re
    import shlex

    from openai_frontend.launcher.cli import parse_serve_args

    page = (Path(__file__).resolve().parents[2] / "docs" / "quantization.md").read_text(encoding="utf-8")
    commands = [line.strip() for line in page.splitlines() if line.strip().startswith("triton-chat serve ")]
    assert commands and any("--quantization int8" in c for c in commands)
    for command in commands:
        words = [str(tmp_path) if word == "DIR" else word for word in shlex.split(command)[1:]]
        options = parse_serve_args(words)
        assert options.model == tmp_path and re.search(r"--quantization (\w+)", command)
