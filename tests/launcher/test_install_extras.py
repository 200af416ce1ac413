"""A frontend-only install: the launcher's commands import no torch, and the demo conversion says
which extra it needs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from openai_frontend.launcher import demo_model

REPO_ROOT = Path(__file__).resolve().parents[2]
# Runs a command's code path in a fresh interpreter and prints the heavy packages it loaded.
_PROBE = """
import sys
from openai_frontend.launcher.cli import main
from openai_frontend.launcher.frontend_only import run_frontend  # the app, as `frontend` imports it
for argv in (["serve", "--help"], ["frontend", "--help"]):
    try:
        main(argv)
    except SystemExit:
        pass
print("LOADED", sorted(name for name in ("torch", "transformers", "xgrammar", "peft") if name in sys.modules))
"""


def test_frontend_and_serve_help_import_no_torch() -> None:
    result = subprocess.run(
        [sys.executable, "-c", _PROBE], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    assert "usage: triton-chat serve" in result.stdout and "usage: triton-chat frontend" in result.stdout
    assert result.stdout.strip().splitlines()[-1] == "LOADED []"


def test_demo_conversion_without_torch_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = demo_model.importlib.util.find_spec

    def without_torch(name: str, *args: object) -> object:
        return None if name == "torch" else real_find_spec(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(demo_model.importlib.util, "find_spec", without_torch)
    monkeypatch.setattr(demo_model, "find_demo_gguf", lambda: tmp_path / demo_model.DEMO_GGUF_NAME)
    with pytest.raises(demo_model.DemoModelError) as caught:
        demo_model.ensure_demo_model(tmp_path, lambda _: None)
    message = str(caught.value)
    assert "\n" not in message
    assert "needs torch" in message and "pip install 'triton-chat[model]'" in message
    assert not demo_model.demo_model_dir(tmp_path).exists()  # nothing half-converted left behind
