"""The prefill inputs of a media request, and Qwen2-VL's M-RoPE positions.

Owns: ``media_prefill_inputs``. Qwen2-VL rotates with 3-D positions (time, height, width): an
image's tokens share positions, so after a media prompt the next position is not the prompt
length. The model's ``get_rope_index`` gives the prompt's 3-D positions and ``rope_delta`` (next
position minus prompt length); the engine adds that delta to each later decode position. Decode
positions are then equal in all three dimensions, so the engine passes them 1-D per row and the
model expands them to three identical rows, the same form text-only rows use.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch

from python_backend.prompt.multimodal.processor import MediaInputs


@dataclass
class MediaPrefill:
    inputs: dict[str, Any]  # keyword inputs of the forward pass, on the device
    rope_delta: int


def _rope_index_owner(model: Any) -> Any:
    """transformers 5 keeps ``get_rope_index`` on the inner model, 4.x on the outer one too."""
    inner = getattr(model, "model", None)
    return inner if inner is not None and hasattr(inner, "get_rope_index") else model


def mm_token_types(model: Any, input_ids: torch.Tensor) -> torch.Tensor:
    """Text 0, image 1, video 2 for each token (the processor's ``mm_token_type_ids``)."""
    config = model.config
    types = torch.zeros_like(input_ids, dtype=torch.int)
    types[input_ids == int(config.image_token_id)] = 1
    types[input_ids == int(config.video_token_id)] = 2
    return types


def mrope_positions(
    model: Any, input_ids: torch.Tensor, tensors: dict[str, torch.Tensor], video_seconds: tuple[float, ...] = ()
) -> tuple[torch.Tensor, int]:
    """(position_ids of shape (3, 1, L), rope delta) for one prompt."""
    owner = _rope_index_owner(model)
    accepted = inspect.signature(owner.get_rope_index).parameters
    candidates: dict[str, Any] = {
        "mm_token_type_ids": mm_token_types(model, input_ids),
        "image_grid_thw": tensors.get("image_grid_thw"),
        "video_grid_thw": tensors.get("video_grid_thw"),
        "attention_mask": torch.ones_like(input_ids),
        "second_per_grid_ts": torch.tensor(video_seconds, device=input_ids.device) if video_seconds else None,
    }
    kwargs = {name: value for name, value in candidates.items() if name in accepted}
    positions, deltas = owner.get_rope_index(input_ids, **kwargs)
    return positions, int(deltas.reshape(-1)[0])


def media_prefill_inputs(
    model: Any, prompt_ids: list[int], media: MediaInputs, device: torch.device, dtype: torch.dtype, mrope: bool
) -> MediaPrefill:
    """Forward inputs for the prefill of one media request (batch of one, whole prompt)."""
    input_ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)
    tensors = media.to(device, dtype)
    if mrope:
        positions, delta = mrope_positions(model, input_ids, tensors, media.video_seconds_per_grid)
    else:
        positions, delta = torch.arange(len(prompt_ids), device=device).unsqueeze(0), 0
    return MediaPrefill({"input_ids": input_ids, "position_ids": positions, **tensors}, delta)
