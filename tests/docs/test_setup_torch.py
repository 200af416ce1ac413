"""What the README says set-up installs as torch, checked against scripts/setup.sh itself.

The script runs for real in a scratch checkout (its own copy and pyproject.toml) whose ``.venv``
already exists with a stand-in ``python`` that records each pip call and answers the build report;
so the script's choices are seen without installing anything: the CPU index first where the
machine has no NVIDIA GPU, pip's configured index after it when that index cannot serve torch,
``TRITON_CHAT_TORCH`` exactly as given, and a second run with nothing changed doing nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
HAS_NVIDIA_GPU = Path("/dev/nvidiactl").exists()  # what setup.sh looks at
# Records its arguments; fails a pip call naming --index-url when FAIL_INDEX_URL is set; prints
# the build report's line for the report's script on stdin.
FAKE_PYTHON = """#!/usr/bin/env bash
echo "$*" >> "$CALLS"
if [[ "$1" == "-m" && "$2" == "pip" ]]; then
    [[ -n "${FAIL_INDEX_URL:-}" && "$*" == *--index-url* ]] && exit 1
    exit 0
fi
cat > /dev/null
echo "setup.sh: torch 2.13.0+cpu installed, the CPU build: 0.7 GB on disk with its libraries" >&2
"""


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    shutil.copy2(REPO_ROOT / "scripts" / "setup.sh", root / "scripts" / "setup.sh")
    shutil.copy2(REPO_ROOT / "pyproject.toml", root / "pyproject.toml")
    bin_dir = root / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name, text in (("python", FAKE_PYTHON), ("triton-chat", "#!/usr/bin/env bash\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return root


def run_setup(root: Path, **env: str) -> tuple[list[str], str]:
    """The pip calls of one set-up run and what it told the user."""
    calls = root / "calls"
    calls.unlink(missing_ok=True)
    environment = {k: v for k, v in os.environ.items() if k != "TRITON_CHAT_TORCH"}
    environment.update(PYTHON=sys.executable, CALLS=str(calls), **env)
    done = subprocess.run(
        ["bash", str(root / "scripts" / "setup.sh")], env=environment, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    lines = calls.read_text().splitlines() if calls.exists() else []
    pip = "-m pip --disable-pip-version-check "
    return [line.removeprefix(pip) for line in lines if line.startswith(pip)], done.stderr


@pytest.mark.skipif(HAS_NVIDIA_GPU, reason="this machine has an NVIDIA GPU: set-up takes pip's index")
def test_without_a_gpu_torch_comes_from_the_cpu_index(checkout: Path) -> None:
    pip_calls, said = run_setup(checkout)
    assert [c for c in pip_calls if "torch==2.13.0" in c] == [
        f"install -q --timeout 30 --retries 1 --index-url {CPU_INDEX} torch==2.13.0"
    ]
    assert "CPU build" in said and "GB on disk" in said


@pytest.mark.skipif(HAS_NVIDIA_GPU, reason="this machine has an NVIDIA GPU: set-up takes pip's index")
def test_an_unreachable_cpu_index_falls_back_to_pips_index(checkout: Path) -> None:
    pip_calls, said = run_setup(checkout, FAIL_INDEX_URL="1")
    torch_calls = [c for c in pip_calls if "torch==2.13.0" in c]
    assert len(torch_calls) == 2 and "--index-url" in torch_calls[0]
    assert torch_calls[1] == "install -q torch==2.13.0"
    assert "trying pip's configured index" in said


def test_a_given_requirement_is_installed_exactly_from_pips_index(checkout: Path) -> None:
    pip_calls, _ = run_setup(checkout, TRITON_CHAT_TORCH="torch==2.13.0+cu128")
    assert [c for c in pip_calls if "torch" in c.split()[-1]] == ["install -q torch==2.13.0+cu128"]


def test_a_second_run_with_nothing_changed_installs_nothing(checkout: Path) -> None:
    first, _ = run_setup(checkout)
    second, said = run_setup(checkout)
    assert first and second == [] and said == ""
