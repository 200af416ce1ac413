"""schemathesis against the served OpenAPI document, through the frontend and the real tritonserver:
positive and negative cases, unknown fields among them, each answered by the server without a
server error, without a dropped connection, and as the document says (status, content type,
body schema). Bounded in examples per operation and in time; schemathesis is in the ``test``
extra, and the test is skipped where it is not installed."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import (
    TritonHandle,
    _frontend_values,
    _run_frontend,
    _stop_frontends,
    e2e_settings,
    serving,
)

pytestmark = pytest.mark.e2e
pytest.importorskip("schemathesis")

EXAMPLES = 20  # per operation and phase: a few minutes on two cores
TIME_LIMIT_S = 540
CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"
# Most generated requests name the served model, so that they reach tritonserver instead of a
# 404; valid ones ask for a few tokens, so that none runs for minutes on a busy machine.
CONFIG = """
[dictionaries.models]
values = ["{model}"]

[dictionaries.few]
values = [1, 2, 8]

[parameters]
"body.model" = {{ dictionary = "models", probability = 0.9 }}
"path.model" = {{ dictionary = "models", probability = 0.9 }}
"body.max_tokens" = {{ dictionary = "few", probability = 1.0 }}
"body.max_completion_tokens" = {{ dictionary = "few", probability = 1.0 }}
"""


SERVED = "tiny-fuzzed"


@pytest.fixture(scope="module")
def fuzzed_triton(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonHandle]:
    """The tiny model with a small default and cap of max_tokens: a generated request that leaves
    max_tokens out must not run for minutes."""
    with serving(
        e2e_settings(tiny_model_dir, SERVED, max_iter_times=16), tmp_path_factory.mktemp("triton-fuzzed")
    ) as handle:
        yield handle


def test_schemathesis_finds_no_server_error_no_dropped_answer_and_no_schema_mismatch(
    fuzzed_triton: TritonHandle, tmp_path: Path
) -> None:
    frontends = [_run_frontend(_frontend_values(fuzzed_triton, {}))]
    try:
        _fuzz(frontends[0].url, fuzzed_triton.served_model_name, tmp_path)
    finally:
        _stop_frontends(frontends)


def _fuzz(url: str, model: str, tmp_path: Path) -> None:
    report, config = tmp_path / "report.json", tmp_path / "schemathesis.toml"
    config.write_text(CONFIG.format(model=model))
    command = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "--config-file",
        str(config),
        "run",
        f"{url}/openapi.json",
        "--checks",
        CHECKS,
        "--mode",
        "all",  # negative cases too: wrong types, out of range, unknown fields (allow-extra-parameters)
        "--phases",
        "examples,coverage,fuzzing",
        "--max-examples",
        str(EXAMPLES),
        "--seed",
        "18",
        "--workers",
        "2",
        "--request-timeout",
        "60",
        "--generation-database",
        "none",
        "--no-color",
        "--report",
        "json",
        "--report-json-path",
        str(report),
    ]
    run = subprocess.run(command, capture_output=True, text=True, timeout=TIME_LIMIT_S, cwd=tmp_path, check=False)
    summary = json.loads(report.read_text()) if report.exists() else {}
    assert run.returncode == 0, (summary or run.stdout[-6000:], run.stderr[-2000:])
