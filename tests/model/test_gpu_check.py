"""``scripts/gpu-check.sh`` on a machine without a GPU: it says why it skipped, and exits 0."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.device import engine_test_device

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU machine runs the real check")
def test_without_a_gpu_the_check_says_why_it_skipped() -> None:
    done = subprocess.run(
        ["bash", "scripts/gpu-check.sh"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False,
        env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith("gpu-check.sh: skipped: no NVIDIA GPU on this machine")


def test_the_fixtures_device_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_CHAT_TEST_DEVICE", raising=False)
    assert engine_test_device() == "cpu"
    monkeypatch.setenv("TRITON_CHAT_TEST_DEVICE", "cuda")
    assert engine_test_device() == "cuda"
