"""vLLM's --chat-template, --tokenizer, --seed and --max-logprobs on the serve command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from openai_frontend.launcher import worker
from openai_frontend.launcher.cli import parse_args, parse_serve_args
from openai_frontend.launcher.model_check import ModelFolder, ModelFolderError, check_model_folder
from openai_frontend.launcher.model_repo import MODEL_NAME
from openai_frontend.launcher.options import RepositoryOptions, engine_settings
from openai_frontend.launcher.own_triton import write_repository


def _usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        parse_serve_args(["serve", *argv])
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def _model_without_tokenizer(tmp_path: Path, config: str = "{}") -> tuple[Path, Path]:
    """A model folder with no tokenizer, and a folder with only one (``tokenizer.json``)."""
    model, tokenizer = tmp_path / "model", tmp_path / "tok"
    model.mkdir()
    (model / "config.json").write_text(config)
    (model / "model.safetensors").write_text("")
    tokenizer.mkdir()
    (tokenizer / "tokenizer.json").write_text("{}")
    return model, tokenizer


def test_the_flags_reach_the_engine_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages[0].content }}")
    tokenizer = tmp_path / "tok"
    tokenizer.mkdir()
    (tokenizer / "tokenizer.json").write_text("{}")
    monkeypatch.chdir(tmp_path)  # relative paths become absolute: the stub runs elsewhere
    options = parse_serve_args(
        ["serve", "--chat-template", "t.jinja", "--tokenizer", "tok", "--seed", "7", "--max-logprobs", "5"]
    )
    settings = engine_settings(options, tmp_path, "m")
    assert (settings.chat_template, settings.tokenizer) == (str(template), str(tokenizer))
    assert (settings.seed, settings.max_logprobs) == (7, 5)


def test_the_defaults_are_vllms_or_the_models_own(tmp_path: Path) -> None:
    settings = engine_settings(parse_serve_args(["serve"]), tmp_path, "m")
    assert (settings.chat_template, settings.tokenizer, settings.seed, settings.max_logprobs) == ("", "", -1, 20)


def test_a_one_line_template_is_kept_as_given(tmp_path: Path) -> None:
    literal = "{% for m in messages %}{{ m.content }}\\n{% endfor %}"
    settings = engine_settings(parse_serve_args(["serve", "--chat-template", literal]), tmp_path, "m")
    assert settings.chat_template == literal


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--chat-template", "no/such/template.jinja"], "--chat-template: 'no/such/template.jinja' looks like"),
        (["--chat-template", "{% for m in messages %}"], "--chat-template: the template does not compile"),
        (["--tokenizer", "no/such/folder"], "--tokenizer: 'no/such/folder' is not a folder"),
        (["--seed", "x"], "--seed"),
        (["--max-logprobs", "-3"], "--max-logprobs"),
    ],
)
def test_a_bad_value_is_a_usage_error_naming_the_flag(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert message in _usage_error(argv, capsys)


def test_a_tokenizer_folder_without_a_tokenizer_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "has no tokenizer" in _usage_error(["--tokenizer", str(tmp_path)], capsys)


def test_the_model_folder_check_looks_in_the_tokenizer_folder(tmp_path: Path) -> None:
    model, tokenizer = _model_without_tokenizer(tmp_path)
    with pytest.raises(ModelFolderError, match="no tokenizer"):
        check_model_folder(ModelFolder(model, "--model"))
    with pytest.raises(ModelFolderError, match="--chat-template"):
        check_model_folder(ModelFolder(model, "--model", tokenizer=str(tokenizer)))
    assert check_model_folder(ModelFolder(model, "--model", tokenizer=str(tokenizer), chat_template=True)) == model


def test_a_repository_for_your_own_triton_takes_the_tokenizer_folder(tmp_path: Path) -> None:
    model, tokenizer = _model_without_tokenizer(tmp_path, '{"torch_dtype": "float32"}')
    (tokenizer / "chat_template.jinja").write_text("{{ messages[0].content }}")
    argv = ["repository", str(tmp_path / "models"), "--model", str(model), "--dtype", "float32"]
    options = parse_args([*argv, "--tokenizer", str(tokenizer), "--seed", "3"])
    assert isinstance(options, RepositoryOptions)
    assert write_repository(options) == model.resolve()
    written = (tmp_path / "models" / MODEL_NAME / "config.pbtxt").read_text()
    assert f'string_value: "{tokenizer.resolve()}"' in written
    with pytest.raises(ModelFolderError, match="no tokenizer"):
        write_repository(parse_args([argv[0], str(tmp_path / "other"), *argv[2:]]))  # type: ignore[arg-type]


def test_a_worker_node_takes_the_tokenizer_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, tokenizer = _model_without_tokenizer(tmp_path)
    nodes = ["-tp", "2", "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1", "--master-port", "29500"]
    started: list[list[str]] = []

    def execve(path: str, argv: list[str], env: dict[str, str]) -> None:
        started.append(argv)
        raise SystemExit(0)  # the node would become its rank keeper here

    monkeypatch.setattr(worker.os, "execve", execve)
    argv = ["worker", "--model", str(model), "--device", "cpu", "--chat-template", "{{ messages }}", *nodes]
    assert worker.run_worker(parse_args(argv)) == 1  # type: ignore[arg-type]
    assert started == []
    with pytest.raises(SystemExit):
        worker.run_worker(parse_args([*argv, "--tokenizer", str(tokenizer)]))  # type: ignore[arg-type]
    assert str(tokenizer.resolve()) in started[0][-1]
