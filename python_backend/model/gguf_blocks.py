"""A GGUF file's own 4-bit blocks, as the demo conversion keeps them: read and made ``QuantWeight``.

Owns the ``gguf-blocks/blocks.safetensors`` file of a folder converted from a GGUF file
(``openai_frontend/launcher/demo_model.py`` writes it beside the bfloat16 weights): for each decoder
linear weight the GGUF stored as Q4_0 or Q4_1, its blocks as uint8 ``[N, K / 32, bytes per block]``
under the Hugging Face parameter name, rows already in the Hugging Face order, with the GGML type
of each tensor in the file's metadata. Owns ``read_gguf_weights`` (the file's tensors decoded into
``cpu/quant_linear.QuantWeight``, 4-bit levels with a scale, and for Q4_1 a float offset, per
block of 32) and ``decode_blocks``. Decodes with torch only: serving needs no ``gguf`` package.
May import torch, safetensors and ``python_backend.cpu``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from python_backend.cpu.quant_linear import QuantWeight

BLOCKS_FILE = "gguf-blocks/blocks.safetensors"  # the name demo_model.py writes (GGUF_BLOCKS_NAME there)
BLOCK = 32  # weights per block of Q4_0 and Q4_1
# Bytes per block: an fp16 scale d (Q4_1: and an fp16 minimum m), then 16 bytes of nibbles.
BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20}


class GGUFBlocksError(ValueError):
    """A ``gguf-blocks/blocks.safetensors`` file that cannot be read; the message names the tensor."""


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    """The 32 levels (0..15) of each block: element j is the low nibble of byte j for j < 16, the
    high nibble of byte j - 16 for j >= 16 (ggml's order)."""
    packed = packed.contiguous()  # torch's bit operations are ~20x slower on the strided slice
    return torch.cat([packed & 0x0F, packed >> 4], dim=-1)


def _halves(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """The fp16 number at bytes ``start``, ``start + 1`` of each block (little-endian), as float32."""
    return blocks[..., start : start + 2].contiguous().view(torch.float16).squeeze(-1).float()


def decode_blocks(name: str, ggml_type: str, blocks: torch.Tensor) -> QuantWeight:
    """``blocks`` (uint8 ``[N, K / 32, bytes]``) of type Q4_0 (``w = d (q - 8)``) or Q4_1
    (``w = d q + m``) as levels ``q - 8`` with scale ``d``, and for Q4_1 the offset ``m + 8 d``."""
    size = BLOCK_BYTES.get(ggml_type)
    if size is None:
        raise GGUFBlocksError(f"{name}: GGML type '{ggml_type}' is not supported (Q4_0, Q4_1)")
    if blocks.dtype != torch.uint8 or blocks.dim() != 3 or blocks.shape[2] != size:
        raise GGUFBlocksError(
            f"{name}: {ggml_type} blocks must be uint8 [N, K / {BLOCK}, {size}], not {blocks.dtype} {list(blocks.shape)}"
        )
    rows, groups = int(blocks.shape[0]), int(blocks.shape[1])
    d = _halves(blocks, 0)
    levels = _nibbles(blocks[..., size - BLOCK // 2 :]).view(torch.int8).sub_(8)  # 0..15 read as int8 alike
    offset = _halves(blocks, 2) + 8 * d if ggml_type == "Q4_1" else None
    return QuantWeight(
        values=levels.reshape(rows, groups * BLOCK).contiguous(),
        scale=d,
        zero=None,
        bits=4,
        group_size=BLOCK,
        activations="none",
        offset=offset,
    )


def read_gguf_weights(folder: Path) -> dict[str, QuantWeight]:
    """The folder's GGUF blocks by Hugging Face parameter name; ``FileNotFoundError`` without the file."""
    from safetensors import safe_open

    path = folder / BLOCKS_FILE
    if not path.is_file():
        raise FileNotFoundError(path)
    weights: dict[str, QuantWeight] = {}
    with safe_open(str(path), framework="pt") as handle:
        types = handle.metadata() or {}
        for name in handle.keys():  # noqa: SIM118  # safe_open is not a mapping
            ggml_type = types.get(name)
            if ggml_type is None:
                raise GGUFBlocksError(f"{path.name}: tensor '{name}' has no GGML type in the file's metadata")
            weights[name] = decode_blocks(name, ggml_type, handle.get_tensor(name))
    return weights
