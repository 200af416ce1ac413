"""Checks of the model folder and the device before tritonserver starts.

Owns ``check_model_folder`` (with ``model_folder``, which adds the ``--tokenizer`` and
``--chat-template`` that stand in for the folder's own) and ``check_device``: what the model would find missing only after
tritonserver has started and its stub has imported torch (tens of seconds later, inside a long
Triton table), found here from the files alone, each as one line that says what to do. They read
no weights and import no torch; the model's own checks at load time stay the authority.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "*.pt", "*.pth")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "tokenizer.tiktoken")
TEMPLATE_FILES = ("chat_template.jinja",)
# What the NVIDIA and Ascend drivers create; present exactly when a device can be opened.
NVIDIA_DEVICE = Path("/dev/nvidiactl")
ASCEND_DEVICE = Path("/dev/davinci_manager")


class ModelFolderError(RuntimeError):
    """The model folder or the device cannot work; the message says what to do."""


@dataclass(frozen=True)
class ModelFolder:
    """A model folder and where the user named it (``--model`` or a config.json key)."""

    path: Path
    origin: str  # e.g. "--model" or "config.json ModelConfig.modelWeightPath"
    tokenizer: str = ""  # --tokenizer: the folder the tokenizer comes from instead ("" = this one)
    chat_template: bool = False  # --chat-template given: the folders need no template of their own


def model_folder(path: Path, origin: str, engine_flags: Mapping[str, object]) -> ModelFolder:
    """The model folder with the ``--tokenizer`` and ``--chat-template`` the engine flags give."""
    return ModelFolder(
        path,
        origin,
        tokenizer=str(engine_flags.get("tokenizer") or ""),
        chat_template=bool(engine_flags.get("chat_template")),
    )


def check_model_folder(folder: ModelFolder) -> Path:
    """The folder's absolute path when it looks like a Hugging Face chat model, else one clear error."""
    path = folder.path.expanduser()
    where = f"{folder.origin} {folder.path}"
    if not path.is_dir():
        raise ModelFolderError(
            f"{where} is not a folder; pass the Hugging Face model folder (the one with config.json)"
        )
    config = _read_json(path / "config.json", where)
    if config is None:
        raise ModelFolderError(
            f"{where} has no config.json; pass the folder of a Hugging Face model "
            "(config.json, the weights and the tokenizer files)"
        )
    if not any(next(path.glob(pattern), None) for pattern in WEIGHT_PATTERNS):
        raise ModelFolderError(
            f"{where} has no weights (*.safetensors or pytorch_model*.bin); download or copy the whole model folder"
        )
    tokenizer = Path(folder.tokenizer).expanduser() if folder.tokenizer else path
    if not any((tokenizer / name).is_file() for name in TOKENIZER_FILES):
        raise ModelFolderError(
            f"{where} has no tokenizer (tokenizer.json or tokenizer.model); copy the tokenizer files into it"
        )
    if not (folder.chat_template or _has_chat_template(tokenizer, where) or _has_chat_template(path, where)):
        raise ModelFolderError(
            f"{where} has no chat template; use the chat (Instruct) version of the model, or add "
            "chat_template.jinja or a 'chat_template' in tokenizer_config.json, or give --chat-template"
        )
    return path.resolve()


def check_device(device: str, origin: str = "--device") -> None:
    """Fail in one line when ``device`` names an accelerator this machine does not have."""
    base = device.split(":", 1)[0]
    if base == "cuda" and not NVIDIA_DEVICE.exists():
        raise ModelFolderError(
            f"{origin} {device}: this machine has no NVIDIA GPU ({NVIDIA_DEVICE} is missing); "
            "use --device cpu, or auto to take what is there"
        )
    if base == "npu":
        if importlib.util.find_spec("torch_npu") is None:
            raise ModelFolderError(
                f"{origin} {device}: torch_npu is not installed; install the ascend extra "
                "('triton-chat[model,ascend]') and the CANN toolkit, or use --device cpu"
            )
        if not ASCEND_DEVICE.exists():
            raise ModelFolderError(
                f"{origin} {device}: this machine has no Ascend NPU ({ASCEND_DEVICE} is missing); use --device cpu"
            )


def _has_chat_template(path: Path, where: str) -> bool:
    if any((path / name).is_file() for name in TEMPLATE_FILES):
        return True
    if next(path.glob("additional_chat_templates/*.jinja"), None) is not None:
        return True
    for name in ("tokenizer_config.json", "chat_template.json"):
        data = _read_json(path / name, where) or {}
        if data.get("chat_template"):
            return True
    return False


def _read_json(path: Path, where: str) -> dict[str, Any] | None:
    """The file's object; None when it is absent; an error naming it when it does not parse."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFolderError(f"{where}: {path.name} cannot be read ({exc}); copy the model folder again") from exc
    if not isinstance(data, dict):
        raise ModelFolderError(f"{where}: {path.name} is not a JSON object; copy the model folder again")
    return data
