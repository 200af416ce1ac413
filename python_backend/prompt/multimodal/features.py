"""Model inputs from decoded media: Qwen2-VL image and video patches, Qwen2-Audio mel features.

Owns: ``VisionFeatures`` (images through the model's own image processor; videos patchified here
the way Qwen2-VL's video processor does, because that processor needs torchvision) and
``AudioFeatures`` (the model's Whisper feature extractor). Each also says how many placeholder
tokens an item takes in the prompt, with the same rule as the model's processor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image

from python_backend.prompt.multimodal.media_decode import AudioClip, VideoClip

# Per-frame pixel ceiling for video (Qwen2-VL's VIDEO_MAX_PIXELS = 768 * 28 * 28).
_VIDEO_MAX_FRAME_PIXELS = 768 * 28 * 28


@dataclass(frozen=True)
class ItemFeatures:
    """One item's tensors (concatenated along dim 0 across items) and its placeholder count."""

    tensors: dict[str, torch.Tensor]
    tokens: int
    seconds_per_grid: float | None = None  # video: seconds one temporal patch spans (Qwen2.5-VL's rope)


def _smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen2-VL's rule: sides multiple of ``factor``, area within bounds, aspect ratio kept."""
    h = max(factor, round(height / factor) * factor)
    w = max(factor, round(width / factor) * factor)
    if h * w > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def _pixel_bounds(image_processor: Any) -> tuple[int, int]:
    """(min_pixels, max_pixels): attributes in transformers 4.x, ``size`` edges in 5.x."""
    size = getattr(image_processor, "size", None)
    low = getattr(image_processor, "min_pixels", None) or getattr(size, "shortest_edge", None)
    high = getattr(image_processor, "max_pixels", None) or getattr(size, "longest_edge", None)
    if isinstance(size, dict):
        low = low or size.get("shortest_edge")
        high = high or size.get("longest_edge")
    return int(low or 56 * 56), int(high or 28 * 28 * 1280)


class VisionFeatures:
    """Qwen2-VL / Qwen2.5-VL pixel inputs."""

    def __init__(self, image_processor: Any) -> None:
        self._processor = image_processor
        self.patch_size = int(image_processor.patch_size)
        self.temporal_patch_size = int(image_processor.temporal_patch_size)
        self.merge_size = int(image_processor.merge_size)
        self._mean = np.asarray(image_processor.image_mean, dtype=np.float32).reshape(1, 3, 1, 1)
        self._std = np.asarray(image_processor.image_std, dtype=np.float32).reshape(1, 3, 1, 1)
        self._min_pixels, self._max_pixels = _pixel_bounds(image_processor)

    def image(self, image: Image.Image) -> ItemFeatures:
        out = self._processor(images=[image], return_tensors="pt")
        grid = out["image_grid_thw"]
        tensors = {"pixel_values": out["pixel_values"], "image_grid_thw": grid}
        return ItemFeatures(tensors, int(grid.prod()) // self.merge_size**2)

    def video(self, clip: VideoClip) -> ItemFeatures:
        factor = self.patch_size * self.merge_size
        first = clip.frames[0]
        height, width = _smart_resize(
            first.height, first.width, factor, self._min_pixels, min(self._max_pixels, _VIDEO_MAX_FRAME_PIXELS)
        )
        frames = [f.resize((width, height), Image.Resampling.BICUBIC) for f in clip.frames]
        # The temporal patch groups frames in pairs: repeat the last frame to fill the group.
        while len(frames) % self.temporal_patch_size:
            frames.append(frames[-1])
        video = np.stack([np.asarray(f, dtype=np.float32) for f in frames]).transpose(0, 3, 1, 2) / 255.0
        video = (video - self._mean) / self._std
        t, p, m = self.temporal_patch_size, self.patch_size, self.merge_size
        grid_t, grid_h, grid_w = len(frames) // t, height // p, width // p
        patches = video.reshape(grid_t, t, 3, grid_h // m, m, p, grid_w // m, m, p)
        patches = patches.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
        flat = patches.reshape(grid_t * grid_h * grid_w, 3 * t * p * p)
        grid = torch.tensor([[grid_t, grid_h, grid_w]], dtype=torch.long)
        tensors = {"pixel_values_videos": torch.from_numpy(np.ascontiguousarray(flat)), "video_grid_thw": grid}
        return ItemFeatures(tensors, grid_t * grid_h * grid_w // m**2, seconds_per_grid=t / clip.fps)


class AudioFeatures:
    """Qwen2-Audio mel features from its Whisper feature extractor."""

    def __init__(self, feature_extractor: Any) -> None:
        self._extractor = feature_extractor
        self.sampling_rate = int(feature_extractor.sampling_rate)

    def audio(self, clip: AudioClip) -> ItemFeatures:
        out = self._extractor(
            [clip.samples],
            sampling_rate=clip.sampling_rate,
            return_attention_mask=True,
            padding="max_length",
            return_tensors="pt",
        )
        mask = out["attention_mask"]
        length = int(mask.sum())
        # Two stride-2 stages in the encoder (Qwen2AudioProcessor's count).
        tokens = (((length - 1) // 2 + 1) - 2) // 2 + 1
        return ItemFeatures({"input_features": out["input_features"], "feature_attention_mask": mask}, tokens)
