"""Session-wide fixtures (tiny random-weight chat models built offline once per session) and tiers.

Tiers, as markers set here from where a test lives and what it uses: ``e2e`` (tests/e2e: the real
tritonserver), ``model`` (torch and a tiny model, no tritonserver), and unmarked unit tests that
need neither. ``slow`` is set by the tests themselves. ``scripts/test.sh`` runs every tier;
``scripts/test.sh -m "not e2e"`` the fast ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.device import engine_test_device
from tests.fixtures.tiny_models import build_tiny_chat_model, train_tiny_tokenizer
from tests.fixtures.trained_models import build_trained_chat_model


@pytest.fixture(scope="session")
def tiny_tokenizer() -> Any:
    """The trained tiny tokenizer (one training per session, shared by both model folders)."""
    return train_tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer: Any) -> Path:
    """A tiny random Qwen2 chat model folder (ChatML with tools and <think>)."""
    return build_tiny_chat_model(tmp_path_factory.mktemp("tiny-qwen2-chat"), "qwen2", tiny_tokenizer)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer: Any) -> Path:
    """The same tokenizer and template on a tiny random Llama model."""
    return build_tiny_chat_model(tmp_path_factory.mktemp("tiny-llama-chat"), "llama", tiny_tokenizer)


@pytest.fixture(scope="session")
def trained_model_dir(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, tiny_tokenizer: Any) -> Path:
    """The tiny Qwen2 model overfitted to answer with a tool call and with <think> reasoning."""
    return build_trained_chat_model(tiny_model_dir, tmp_path_factory.mktemp("tiny-trained-chat"), tiny_tokenizer)


@pytest.fixture(scope="session")
def tiny_lora_dir(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """A LoRA adapter for ``tiny_model_dir`` whose random weights change its output."""
    from tests.fixtures.tiny_lora import build_tiny_lora

    return build_tiny_lora(tiny_model_dir, tmp_path_factory.mktemp("tiny-lora"))


@pytest.fixture(scope="session")
def tiny_loaded(tiny_model_dir: Path) -> Any:
    """The tiny Qwen2 model loaded once on the CPU in float32 (engine and CPU-path tests)."""
    from python_backend.model.loader import load_model
    from python_backend.protocol.settings import EngineSettings

    return load_model(EngineSettings(model_path=str(tiny_model_dir), dtype="float32", device=engine_test_device()))


_MODEL_FIXTURES = frozenset(
    {"tiny_model_dir", "tiny_llama_dir", "trained_model_dir", "tiny_lora_dir", "tiny_loaded", "tiny_tokenizer"}
)
_E2E_DIR = Path(__file__).parent / "e2e"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _E2E_DIR in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.e2e)
        elif _MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.model)
