"""``scripts/serve.sh --help`` answers at once: it never runs the set-up (minutes of installs)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

SERVE_SH = Path(__file__).resolve().parents[2] / "scripts" / "serve.sh"


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A checkout whose scripts/setup.sh leaves a mark and fails, so any set-up run shows."""
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    shutil.copy(SERVE_SH, scripts / "serve.sh")
    (scripts / "setup.sh").write_text(f'#!/usr/bin/env bash\ntouch "{tmp_path}/setup-ran"\nexit 1\n')
    return tmp_path


def _run(checkout: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = subprocess.run(
        ["bash", str(checkout / "scripts" / "serve.sh"), *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(checkout)},
    )
    return done, time.monotonic() - started


@pytest.mark.parametrize("args", [("--help",), ("-h",), ("--model", "/m", "--help")])
def test_help_without_a_venv_prints_the_usage_and_installs_nothing(checkout: Path, args: tuple[str, ...]) -> None:
    done, seconds = _run(checkout, *args)
    assert done.returncode == 0, done.stderr
    assert "usage: scripts/serve.sh" in done.stdout and "--max-model-len" in done.stdout
    assert "scripts/setup.sh" in done.stdout  # where the full list comes from
    assert not (checkout / "setup-ran").exists()
    assert seconds < 10


def test_help_with_a_venv_is_triton_chats_own(checkout: Path) -> None:
    bin_dir = checkout / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    fake = bin_dir / "triton-chat"
    fake.write_text('#!/usr/bin/env bash\necho "triton-chat $*"\n')
    fake.chmod(0o755)
    done, _ = _run(checkout, "--help")
    assert (done.returncode, done.stdout) == (0, "triton-chat serve --help\n")
    assert not (checkout / "setup-ran").exists()


def test_without_help_the_set_up_runs_first(checkout: Path) -> None:
    done, _ = _run(checkout, "--model", "/m")
    assert done.returncode == 1
    assert (checkout / "setup-ran").exists()


def test_the_real_checkout_answers_help_within_seconds() -> None:
    done = subprocess.run(["bash", str(SERVE_SH), "--help"], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "--max-model-len" in done.stdout
