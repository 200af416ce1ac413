"""docs/configuration.md's settings tables are what the settings' declarations generate."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from openai_frontend.launcher import config_docs
from python_backend.protocol.settings import EngineSettings, setting_info

DOCS = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_docs_tables_are_up_to_date() -> None:
    page = DOCS.read_text(encoding="utf-8")
    assert config_docs.render(page) == page, f"docs/configuration.md is out of date: run {config_docs.COMMAND}"


def test_a_stale_table_is_rewritten_and_check_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page = DOCS.read_text(encoding="utf-8")
    stale = tmp_path / "configuration.md"
    stale.write_text(page.replace("| `maxBatchSize` | `64` |", "| `maxBatchSize` | `32` |"), encoding="utf-8")
    assert config_docs.main(["--check", str(stale)]) == 1
    assert "out of date" in capsys.readouterr().err
    assert config_docs.main([str(stale)]) == 0
    assert stale.read_text(encoding="utf-8") == page


def test_every_flag_and_key_has_a_row() -> None:
    page = DOCS.read_text(encoding="utf-8")
    for spec in fields(EngineSettings):
        info = setting_info(spec)
        assert f"| `{spec.name}` |" in page  # the config.pbtxt parameters table
        if info.flag:
            assert f"`{info.flag}" in page
        if info.mindie_key:
            assert f"| `{info.mindie_key}` |" in page
    for flag in ("--host", "--api-key", "--no-response-channel", "--drain-timeout", "--max-restarts"):
        assert f"`{flag}`" in page


def test_a_page_without_the_markers_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="begin generated: server"):
        config_docs.render("# Configuration\n")
