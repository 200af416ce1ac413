"""A multimodal model's prompt step: rendered chat text plus decoded media -> ids and tensors.

Owns: ``MediaProcessor`` (built from the model folder: which media kinds it takes, its
placeholder tokens, its feature builders), ``MediaInputs`` (the extra forward inputs a request
carries into the engine) and ``EncodedPrompt``. Each media placeholder the chat template wrote is
expanded to the item's token count here, the same rule as the model's processor, rather than by
``AutoProcessor``: Qwen2-VL's processor cannot be built without torchvision (its video processor)
and it rejects prompts with video placeholders but no video processor. See docs/multimodal.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from python_backend.prompt.multimodal.features import AudioFeatures, ItemFeatures, VisionFeatures
from python_backend.prompt.multimodal.media_decode import AudioClip, DecodedMedia, MediaLimits, VideoClip
from python_backend.protocol.errors import invalid

VISION_MODEL_TYPES = frozenset({"qwen2_vl", "qwen2_5_vl"})
AUDIO_MODEL_TYPES = frozenset({"qwen2_audio"})
MULTIMODAL_MODEL_TYPES = VISION_MODEL_TYPES | AUDIO_MODEL_TYPES

_IMAGE_TOKEN = "<|image_pad|>"
_VIDEO_TOKEN = "<|video_pad|>"
_AUDIO_TOKEN = "<|AUDIO|>"


@dataclass
class MediaInputs:
    """Extra forward inputs of one request's prefill (batch of one), on the CPU until prefill."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    kinds: tuple[str, ...] = ()  # the kinds present, for logs and decisions
    # Per video, seconds per temporal patch: Qwen2.5-VL spaces video positions in time with it.
    video_seconds_per_grid: tuple[float, ...] = ()

    def to(self, device: torch.device, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """The tensors on ``device``; float ones in the model's dtype."""
        return {
            name: t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)
            for name, t in self.tensors.items()
        }


@dataclass(frozen=True)
class EncodedPrompt:
    prompt_ids: list[int]
    media: MediaInputs | None


@dataclass(frozen=True)
class MediaItem:
    kind: str  # image / video / audio
    where: str  # the message part, for errors
    value: DecodedMedia


class MediaProcessor:
    """What a multimodal model folder needs to turn media into inputs."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        vision: VisionFeatures | None = None,
        audio: AudioFeatures | None = None,
        limits: MediaLimits | None = None,
    ) -> None:
        self._tokenizer = tokenizer
        self._vision = vision
        self._audio = audio
        self.limits = limits or MediaLimits()
        kinds = {"image", "video"} if vision is not None else set()
        if audio is not None:
            kinds.add("audio")
        self.kinds = frozenset(kinds)

    @property
    def sampling_rate(self) -> int:
        return self._audio.sampling_rate if self._audio is not None else 16000

    @classmethod
    def from_folder(
        cls, folder: Path, model_type: str, tokenizer: PreTrainedTokenizerBase, limits: MediaLimits | None = None
    ) -> MediaProcessor | None:
        """The processor of a multimodal folder; None for a text-only ``model_type``."""
        if model_type in VISION_MODEL_TYPES:
            from transformers import AutoImageProcessor

            image_processor = AutoImageProcessor.from_pretrained(str(folder), local_files_only=True)
            return cls(tokenizer, vision=VisionFeatures(image_processor), limits=limits)
        if model_type in AUDIO_MODEL_TYPES:
            from transformers import AutoFeatureExtractor

            extractor = AutoFeatureExtractor.from_pretrained(str(folder), local_files_only=True)
            return cls(tokenizer, audio=AudioFeatures(extractor), limits=limits)
        return None

    def _features(self, item: MediaItem) -> ItemFeatures:
        value = item.value
        if item.kind == "audio" and self._audio is not None and isinstance(value, AudioClip):
            return self._audio.audio(value)
        if item.kind == "video" and self._vision is not None and isinstance(value, VideoClip):
            return self._vision.video(value)
        if item.kind == "image" and self._vision is not None and not isinstance(value, AudioClip | VideoClip):
            return self._vision.image(value)
        raise invalid(f"this model does not accept {item.kind} input; '{item.where}' is {item.kind}", item.where)

    def encode(self, text: str, items: list[MediaItem]) -> EncodedPrompt:
        """Expand each placeholder of ``text`` for its item (in order per kind) and tokenize."""
        per_kind: dict[str, list[ItemFeatures]] = {"image": [], "video": [], "audio": []}
        for item in items:
            per_kind[item.kind].append(self._features(item))
        for kind, token in (("image", _IMAGE_TOKEN), ("video", _VIDEO_TOKEN), ("audio", _AUDIO_TOKEN)):
            found = text.count(token)
            if found != len(per_kind[kind]):
                raise invalid(
                    f"the chat template wrote {found} {kind} placeholder(s) for {len(per_kind[kind])} {kind} part(s)",
                    "messages",
                )
            if found:
                pieces = text.split(token)
                counts = [f.tokens for f in per_kind[kind]]
                text = pieces[0] + "".join(token * n + rest for n, rest in zip(counts, pieces[1:], strict=True))
        # The template already wrote BOS and role tokens; adding specials again would double them.
        ids = [int(i) for i in self._tokenizer.encode(text, add_special_tokens=False)]
        tensors: dict[str, torch.Tensor] = {}
        for features in per_kind.values():
            for f in features:
                for name, tensor in f.tensors.items():
                    tensors[name] = torch.cat([tensors[name], tensor]) if name in tensors else tensor
        if not tensors:
            return EncodedPrompt(ids, None)
        kinds = tuple(k for k, v in per_kind.items() if v)
        seconds = tuple(f.seconds_per_grid or 0.0 for f in per_kind["video"])
        return EncodedPrompt(ids, MediaInputs(tensors, kinds, seconds))
