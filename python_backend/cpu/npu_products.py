"""Quantized products on Ascend NPUs, through torch-npu's own operators.

Owns ``NpuQuantProduct`` (W8A8: the rows quantized to int8 per token, or with the checkpoint's
static scale, then ``torch_npu.npu_quant_matmul`` with the per-token scales, the weight's
per-channel scales and the bias applied inside the operator) and ``NpuWeightQuantProduct``
(W8A16: ``torch_npu.npu_weight_quant_batchmatmul``, which widens the int8 weight inside the
operator, per channel or per group, symmetric or with zero points). ``quant_linear.py`` chooses
them for layers on an NPU; both take the operator module as an argument (``torch_npu``, or a
stand-in in the tests), so nothing here imports torch-npu.

The operators' contracts, as torch-npu documents them: the weight is ``[K, N]`` (the transpose of
a checkpoint's ``[N, K]``); W8A8 takes float32 weight scales ``[N]``, float32 per-token scales
``[M]``, a float32 bias and a float16 or bfloat16 output; W8A16 computes
``x @ ((w + offset) * scale) + bias`` with scales and offsets ``[N]`` (per channel) or
``[K / group, N]`` (per group, groups a multiple of 32 and shorter than K) in the input's dtype,
and a float32 bias for bfloat16 inputs. Float16 and bfloat16 models only; ``quant_linear.py``
widens the weights per call for the rest.

May import torch only.
"""

from __future__ import annotations

from typing import Any

import torch

HALF_DTYPES = (torch.float16, torch.bfloat16)
_GROUP_MULTIPLE = 32  # npu_weight_quant_batchmatmul's groups are multiples of this


def _operator(ops: Any, name: str) -> Any:
    found = getattr(ops, name, None)
    if found is None:
        raise RuntimeError(f"torch_npu has no {name}: quantized models on Ascend need a torch-npu that has it")
    return found


def weight_quant_takes(in_features: int, group_size: int, has_float_offset: bool) -> bool:
    """Whether ``npu_weight_quant_batchmatmul`` takes an 8-bit weight of this layout."""
    per_channel = group_size == in_features
    return not has_float_offset and (per_channel or (group_size % _GROUP_MULTIPLE == 0 and group_size < in_features))


class NpuQuantProduct:
    """``x`` [M, K] times an int8 weight, the activations quantized to int8 (W8A8)."""

    def __init__(
        self,
        ops: Any,
        values: torch.Tensor,
        scale: torch.Tensor,
        bias: torch.Tensor | None,
        input_scale: torch.Tensor | None,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        """``values`` int8 [N, K], ``scale`` [N] or [N, 1] (per channel), ``input_scale`` the
        checkpoint's static scale (None: one per token), ``dtype`` the output's (float16/bfloat16)."""
        if dtype not in HALF_DTYPES:
            raise ValueError(f"W8A8 on Ascend gives float16 or bfloat16 outputs, not {dtype}")
        self._matmul = _operator(ops, "npu_quant_matmul")
        self.dtype = dtype
        self.weight = values.t().contiguous().to(device)  # [K, N]
        self.weight_scale = scale.reshape(-1).float().to(device)
        self.bias = bias.detach().float().to(device) if bias is not None else None
        self.input_scale = input_scale.float().reshape(1, 1).to(device) if input_scale is not None else None

    def __call__(self, flat: torch.Tensor) -> torch.Tensor:
        rows = flat.float()
        if self.input_scale is not None:
            scale = self.input_scale.expand(rows.shape[0], 1)
        else:
            scale = (rows.abs().amax(dim=1, keepdim=True) / 127.0).clamp(min=torch.finfo(torch.float32).tiny)
        levels = torch.round(rows / scale).clamp(-128, 127).to(torch.int8)
        return self._matmul(
            levels,
            self.weight,
            self.weight_scale,
            pertoken_scale=scale.reshape(-1).contiguous(),
            bias=self.bias,
            output_dtype=self.dtype,
        )

    def tensors(self) -> dict[str, torch.Tensor]:
        """What the product holds, by name (the layer registers them as buffers)."""
        held = {"weight_int8": self.weight, "weight_scale": self.weight_scale}
        return held if self.input_scale is None else {**held, "input_scale": self.input_scale}


class NpuWeightQuantProduct:
    """``x`` [M, K] times an int8 weight widened inside the operator (W8A16)."""

    def __init__(
        self,
        ops: Any,
        values: torch.Tensor,
        scale: torch.Tensor,
        zero: torch.Tensor | None,
        group_size: int,
        bias: torch.Tensor | None,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        """``values`` int8 [N, K]; ``scale`` float [N, G] and ``zero`` int8 [N, G] or None, G groups
        of ``group_size`` along K (G = 1: per channel)."""
        in_features = values.shape[1]
        if dtype not in HALF_DTYPES:
            raise ValueError(f"W8A16 on Ascend takes float16 or bfloat16 inputs, not {dtype}")
        if not weight_quant_takes(in_features, group_size, False):
            raise ValueError(f"groups of {group_size} over {in_features} inputs: Ascend takes multiples of 32")
        self._matmul = _operator(ops, "npu_weight_quant_batchmatmul")
        per_channel = group_size == in_features
        self.group_size = 0 if per_channel else group_size
        self.weight = values.t().contiguous().to(device)  # [K, N]
        # [N] per channel, [G, N] per group, in the input's dtype; the operator adds the offset to
        # the levels before scaling, so a zero point z is the offset -z.
        layout = (lambda t: t.reshape(-1)) if per_channel else (lambda t: t.t())
        self.antiquant_scale = layout(scale).contiguous().to(device, dtype)
        self.antiquant_offset = layout(-zero.float()).contiguous().to(device, dtype) if zero is not None else None
        bias_dtype = torch.float32 if dtype == torch.bfloat16 else dtype
        self.bias = bias.detach().to(device, bias_dtype) if bias is not None else None

    def __call__(self, flat: torch.Tensor) -> torch.Tensor:
        return self._matmul(
            flat,
            self.weight,
            self.antiquant_scale,
            antiquant_offset=self.antiquant_offset,
            bias=self.bias,
            antiquant_group_size=self.group_size,
        )

    def tensors(self) -> dict[str, torch.Tensor]:
        """What the product holds, by name (the layer registers them as buffers)."""
        held = {"weight_int8": self.weight, "antiquant_scale": self.antiquant_scale}
        return held if self.antiquant_offset is None else {**held, "antiquant_offset": self.antiquant_offset}
