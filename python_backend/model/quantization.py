"""Quantized weights at load time: which mode a folder loads in, and its layers made ``QuantLinear``.

Owns ``QuantizationError``, ``QuantPlan`` and ``plan_quantization`` (``--quantization`` against the
folder's ``quantization_config``, read and validated by the ``compressed-tensors`` library),
``load_arguments`` (what ``from_pretrained`` needs for such a folder) and ``quantize_model`` (each
quantized linear layer of the loaded model replaced by ``cpu/quant_linear.QuantLinear``, whose
levels stay int8 or packed 4-bit). Supported: compressed-tensors ``int-quantized``,
``naive-quantized`` and ``pack-quantized`` folders with int8 weights per channel and int8
activations (dynamic per token, or a static per-tensor scale), and weight-only 8/4-bit weights per
channel or per group, symmetric or asymmetric; and ``gguf``: a folder converted from a GGUF file
served from the GGUF's own Q4_0/Q4_1 blocks (``gguf_blocks.py``) instead of its widened weights.
With ``--quantize-lm-head`` the output head, whatever the decoder's mode, becomes W8A8 too. See
docs/quantization.md.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from python_backend.cpu.quant_install import install_quantized
from python_backend.cpu.quant_linear import Int8Paths, QuantLinear, QuantWeight, quantize_per_channel
from python_backend.model.gguf_blocks import BLOCKS_FILE, GGUFBlocksError, read_gguf_weights

logger = logging.getLogger(__name__)

SUPPORTED_FORMATS = ("int-quantized", "naive-quantized", "pack-quantized")
_FIELD = "quantization_config"


class QuantizationError(ValueError):
    """A quantized folder or ``--quantization`` value that cannot be served; the message names the field."""


@dataclass(frozen=True)
class QuantPlan:
    """How the folder's weights load: the decoder's ``mode`` (``none``, ``compressed-tensors``, ``int8``
    made at load time, or ``gguf``: the blocks of the GGUF file the folder was converted from), and
    whether the output head is made W8A8 at load time (``head``)."""

    mode: str
    config: Any = None  # compressed_tensors.QuantizationConfig for a compressed-tensors folder
    summary: str = ""  # for the log and the start-up stage: "W8A8 int8", "W4A16 g32 asym", ...
    head: bool = False

    @property
    def quantized(self) -> bool:
        return self.mode != "none" or self.head

    @property
    def int8_activations(self) -> bool:
        """Whether every quantized layer rounds its input to int8 before its product (W8A8)."""
        if self.mode == "int8":
            return True
        if self.mode != "compressed-tensors":
            return False
        schemes = list(self.config.config_groups.values())
        return bool(schemes) and all(
            s.input_activations is not None and s.input_activations.num_bits == 8 for s in schemes
        )


def _describe(config: Any) -> str:
    parts = []
    for scheme in config.config_groups.values():
        weights, inputs = scheme.weights, scheme.input_activations
        name = f"W{weights.num_bits}A{inputs.num_bits if inputs is not None else 16}"
        if weights.strategy == "group":
            name += f" g{weights.group_size}"
        if not weights.symmetric:
            name += " asym"
        if inputs is not None and not inputs.dynamic:
            name += " static"
        parts.append(name)
    return ", ".join(sorted(set(parts)))


def _check_scheme(name: str, scheme: Any) -> None:
    """Raise naming the field when a config group asks for what no kernel here serves."""
    where = f"{_FIELD}.config_groups.{name}"
    weights, inputs = scheme.weights, scheme.input_activations
    if weights is None:
        raise QuantizationError(f"{where}.weights is missing: only weight-quantized layers are supported")
    if weights.type != "int" or weights.num_bits not in (4, 8):
        raise QuantizationError(
            f"{where}.weights: {weights.type} {weights.num_bits}-bit is not supported (int 8 or 4 bits)"
        )
    if weights.strategy not in ("channel", "group"):
        raise QuantizationError(f"{where}.weights.strategy '{weights.strategy}' is not supported (channel or group)")
    if weights.dynamic:
        raise QuantizationError(f"{where}.weights.dynamic must be false")
    if inputs is not None:
        if weights.num_bits != 8 or weights.strategy != "channel" or not weights.symmetric:
            raise QuantizationError(
                f"{where}.input_activations: int8 activations are supported with symmetric per-channel "
                "int8 weights only (W8A8)"
            )
        if inputs.type != "int" or inputs.num_bits != 8 or not inputs.symmetric:
            raise QuantizationError(f"{where}.input_activations: only symmetric int8 activations are supported")
        if (inputs.dynamic, inputs.strategy) not in ((True, "token"), (False, "tensor")):
            raise QuantizationError(
                f"{where}.input_activations: strategy '{inputs.strategy}' with dynamic={inputs.dynamic} is not "
                "supported (dynamic per token, or a static per-tensor scale)"
            )
    if scheme.output_activations is not None:
        raise QuantizationError(f"{where}.output_activations is not supported")
    fmt = getattr(scheme, "format", None)
    if fmt is not None and fmt not in SUPPORTED_FORMATS:
        raise QuantizationError(f"{where}.format '{fmt}' is not supported ({', '.join(SUPPORTED_FORMATS)})")


def read_config(raw: Any) -> Any:
    """The folder's ``quantization_config``, parsed by compressed-tensors and checked against our kernels."""
    from pydantic import ValidationError

    try:
        from compressed_tensors.quantization import QuantizationConfig
    except ImportError as exc:
        raise QuantizationError(
            f"this folder's {_FIELD} needs the compressed-tensors package: pip install compressed-tensors"
        ) from exc
    if not isinstance(raw, dict):
        raise QuantizationError(f"{_FIELD} must be an object")
    method = raw.get("quant_method")
    if method != "compressed-tensors":
        raise QuantizationError(f"{_FIELD}.quant_method '{method}' is not supported (compressed-tensors only)")
    try:
        config = QuantizationConfig.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        # pydantic names its model validators in the location ("function-after[...]"): not a field.
        place = ".".join(str(part) for part in first["loc"] if "[" not in str(part))
        message = str(first["msg"]).splitlines()[0]
        raise QuantizationError(f"{_FIELD}.{place}: {message[:200]}") from exc
    if not config.config_groups:
        raise QuantizationError(f"{_FIELD}.config_groups is empty")
    if config.format is not None and config.format not in (*SUPPORTED_FORMATS, "mixed-precision"):
        raise QuantizationError(f"{_FIELD}.format '{config.format}' is not supported ({', '.join(SUPPORTED_FORMATS)})")
    if config.kv_cache_scheme is not None:
        raise QuantizationError(f"{_FIELD}.kv_cache_scheme is not supported")
    for name, scheme in config.config_groups.items():
        _check_scheme(name, scheme)
    return config


def plan_quantization(setting: str, folder_config: dict[str, Any], head: bool = False) -> QuantPlan:
    """``--quantization`` (``auto``, ``none``, ``int8``, ``gguf``) against the folder's ``config.json``;
    ``head``: ``--quantize-lm-head``."""
    plan = _decoder_plan(setting, folder_config)
    if not head:
        return plan
    summary = f"{plan.summary}, output head W8A8 int8" if plan.summary else "output head W8A8 int8"
    return QuantPlan(plan.mode, plan.config, summary, head=True)


def _decoder_plan(setting: str, folder_config: dict[str, Any]) -> QuantPlan:
    raw = folder_config.get(_FIELD)
    if setting == "auto":
        if raw is None:
            return QuantPlan("none")
        config = read_config(raw)
        return QuantPlan("compressed-tensors", config, _describe(config))
    if raw is not None:
        # Widening a quantized folder would hide the cost users chose it to avoid; say so instead.
        raise QuantizationError(
            f"quantization '{setting}' needs a 16/32-bit folder, but this folder's config.json has a "
            f"{_FIELD}: use quantization 'auto' to serve its quantized weights"
        )
    if setting == "none":
        return QuantPlan("none")
    if setting == "int8":
        return QuantPlan("int8", summary="W8A8 int8 (dynamic, made at load time)")
    if setting == "gguf":
        return QuantPlan("gguf", summary="W4A16 g32, the GGUF file's Q4_0/Q4_1 blocks")
    raise QuantizationError(f"quantization '{setting}' is not one of auto, none, int8, gguf")


def load_arguments(plan: QuantPlan) -> dict[str, Any]:
    """Extra ``from_pretrained`` arguments for ``plan``.

    compressed-tensors 0.20 lays out an asymmetric ``pack-quantized`` zero point unpacked while
    the checkpoint holds it packed, so transformers would refuse the sizes: those (and only those,
    ``check_loading``) are allowed to mismatch and are read again from the files.
    """
    if plan.mode != "compressed-tensors":
        return {}
    return {"ignore_mismatched_sizes": True, "output_loading_info": True}


def _zero_point_names(info: dict[str, Any]) -> set[str]:
    """The mismatched keys of a load, which must all be zero points (``load_arguments``)."""
    names = set()
    for entry in info.get("mismatched_keys") or []:
        key = entry[0] if isinstance(entry, tuple | list) else entry
        if not str(key).endswith(".weight_zero_point"):
            raise QuantizationError(f"the checkpoint's tensor '{key}' does not match the model's shape")
        names.add(str(key).removesuffix(".weight_zero_point"))
    return names


def _read_tensors(folder: Path, keys: set[str]) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    found: dict[str, torch.Tensor] = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            for key in keys & set(handle.keys()):
                found[key] = handle.get_tensor(key)
    return found


def _module_weight(name: str, module: Any, packed_zero: torch.Tensor | None) -> QuantWeight:
    """A loaded compressed-tensors layer's levels, scales and zero points (unpacked by the library)."""
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

    scheme = module.quantization_scheme
    args = scheme.weights
    scale = module.weight_scale.detach().float()
    if hasattr(module, "weight_packed"):
        shape = torch.Size(int(d) for d in module.weight_shape.tolist())
        values = unpack_from_int32(module.weight_packed.detach(), args.num_bits, shape)
    else:
        values = module.weight.detach()
        if values.dtype != torch.int8:
            raise QuantizationError(
                f"{_FIELD}: layer '{name}' holds {values.dtype} weights, not int8 levels "
                "(quantization_status must be 'compressed')"
            )
    values = values.to(torch.int8)
    zero = None
    if not args.symmetric:
        if packed_zero is not None:
            zero = unpack_from_int32(packed_zero, args.num_bits, torch.Size(scale.shape), packed_dim=0)
        else:
            zero = module.weight_zero_point.detach()
        zero = zero.to(torch.int8).reshape(scale.shape)
    inputs = scheme.input_activations
    activations = "none" if inputs is None else ("dynamic" if inputs.dynamic else "static")
    input_scale = module.input_scale.detach().float().reshape(()) if activations == "static" else None
    group = args.group_size if args.strategy == "group" else values.shape[1]
    return QuantWeight(values, scale.reshape(values.shape[0], -1), zero, args.num_bits, group, activations, input_scale)


def _gguf_parts(base: Any, folder: Path, prefix: str) -> dict[str, tuple[QuantWeight, torch.Tensor | None]]:
    """The folder's GGUF blocks (``gguf_blocks.py``) by the decoder's layer names, with their biases."""
    try:
        weights = read_gguf_weights(folder)
    except FileNotFoundError as exc:
        raise QuantizationError(
            f"quantization 'gguf' needs a folder converted from a GGUF file (the demo model); {folder} has no "
            f"{BLOCKS_FILE}"
        ) from exc
    except GGUFBlocksError as exc:
        raise QuantizationError(f"quantization 'gguf': {folder / BLOCKS_FILE}: {exc}") from exc
    parts: dict[str, tuple[QuantWeight, torch.Tensor | None]] = {}
    for key, weight in weights.items():
        name = key.removesuffix(".weight")
        try:
            module = base.get_submodule(name) if name.startswith(prefix) else None
        except AttributeError:
            module = None
        if not isinstance(module, torch.nn.Linear):
            raise QuantizationError(
                f"quantization 'gguf': {BLOCKS_FILE} holds '{key}', which is no linear layer of the model's decoder"
            )
        if tuple(module.weight.shape) != (weight.out_features, weight.in_features):
            raise QuantizationError(
                f"quantization 'gguf': {BLOCKS_FILE}'s '{key}' is {weight.out_features} x {weight.in_features}, "
                f"the model's layer {module.out_features} x {module.in_features}"
            )
        parts[name.removeprefix(prefix)] = (weight, module.bias)
    if not parts:
        raise QuantizationError(f"quantization 'gguf': {folder / BLOCKS_FILE} holds no 4-bit blocks")
    return parts


def _decoder_prefix(base: Any, decoder: Any) -> str:
    """The decoder's name in ``base``, with the dot: ``model.``."""
    return next(name for name, module in base.named_modules() if module is decoder) + "."


def quantize_model(
    base: Any, plan: QuantPlan, folder: Path, info: dict[str, Any], dtype: torch.dtype, device: torch.device
) -> int:
    """Replace the quantized (or, for ``int8``, every decoder) linear layer of ``base``, and with
    ``plan.head`` its output head; returns how many.

    q/k/v and gate/up of Llama and Qwen2 layers become one quantized product each.
    """
    decoder = base.get_decoder()
    parts: dict[str, tuple[QuantWeight, torch.Tensor | None]] = {}
    if plan.mode == "int8":
        for name, module in decoder.named_modules():
            if type(module) is torch.nn.Linear:
                parts[name] = (quantize_per_channel(module.weight), module.bias)
    elif plan.mode == "gguf":
        parts = _gguf_parts(base, folder, _decoder_prefix(base, decoder))
    elif plan.mode == "compressed-tensors":
        prefix = _decoder_prefix(base, decoder)
        refetch = _zero_point_names(info)
        zeros = _read_tensors(folder, {f"{name}.weight_zero_point" for name in refetch})
        if zeros:
            logger.info(
                "read %d packed zero points from the checkpoint (transformers' MISMATCH report for them is "
                "expected: compressed-tensors sizes them unpacked)",
                len(zeros),
            )
        for name, module in base.named_modules():
            if getattr(module, "quantization_scheme", None) is None or not isinstance(module, torch.nn.Linear):
                continue
            if not name.startswith(prefix):
                raise QuantizationError(f"{_FIELD}: layer '{name}' is quantized; only decoder layers are supported")
            weight = _module_weight(name, module, zeros.get(f"{name}.weight_zero_point"))
            parts[name.removeprefix(prefix)] = (weight, module.bias)
        # compressed-tensors would otherwise widen every layer on the first forward pass.
        hook = getattr(base, "ct_decompress_hook", None)
        if hook is not None:
            hook.remove()
            del base.ct_decompress_hook
        if not parts:
            raise QuantizationError(f"{_FIELD}: no linear layer of the model matches its targets")
    dynamic = plan.head or any(weight.activations != "none" for weight, _ in parts.values())
    int8 = Int8Paths.build() if dynamic and device.type == "cpu" else None
    install_quantized(decoder, parts, dtype, device, int8)
    count = len(parts)
    if plan.head:
        _quantize_head(base, dtype, device, int8)
        count += 1
    logger.info("quantized weights (%s): %d linear layers", plan.summary, count)
    return count


def _quantize_head(base: Any, dtype: torch.dtype, device: torch.device, int8: Int8Paths | None) -> None:
    """``base``'s output head as a W8A8 ``QuantLinear``. A head tied to the input embeddings gets
    levels of its own: the embeddings' lookup keeps the float weight."""
    head = base.get_output_embeddings()
    if type(head) is not torch.nn.Linear:
        raise QuantizationError(
            f"quantize_lm_head: this model's output head is a {type(head).__name__}, not a linear layer"
        )
    base.set_output_embeddings(QuantLinear(quantize_per_channel(head.weight), head.bias, dtype, device, int8))
