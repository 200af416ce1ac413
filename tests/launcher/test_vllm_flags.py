"""vLLM's flag names: each parses to the same setting as this launcher's own name, and --help
shows them with every default."""

from __future__ import annotations

import argparse
import json
import logging
import logging.config
from pathlib import Path
from typing import Any

import pytest

from openai_frontend.launcher.cli import build_parser, main, parse_args, parse_serve_args
from openai_frontend.launcher.engine_flags import size_in_mib
from openai_frontend.launcher.frontend_only import frontend_settings
from openai_frontend.launcher.log_format import configure_launcher_logging, uvicorn_log_config
from openai_frontend.launcher.options import FrontendOptions, RepositoryOptions, ServeOptions, engine_settings
from openai_frontend.media.errors import MediaError
from openai_frontend.media.local import local_components, read_local_file
from openai_frontend.media.parts import LocalSource, extract_media
from openai_frontend.media.policy import MediaSettings
from python_backend.protocol.errors import ContractError
from python_backend.protocol.settings import EngineSettings


def _serve(*flags: str) -> ServeOptions:
    return parse_serve_args(["serve", *flags])


def _settings(options: ServeOptions, tmp_path: Path) -> EngineSettings:
    return engine_settings(options, tmp_path, "m")


def _usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        parse_serve_args(["serve", *argv])
    assert exit_info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("ours", "vllms", "field", "value"),
    [
        (["--max-seq-len", "1024"], ["--max-model-len", "1024"], "max_seq_len", 1024),
        (["--tensor-parallel-size", "2"], ["-tp", "2"], "tensor_parallel_size", 2),
        (["--kv-cache-memory-mb", "4096"], ["--kv-cache-memory-bytes", "4G"], "kv_cache_memory_mb", 4096),
        (["--kv-cache-memory-mb", "4096"], ["--kv-cache-memory-bytes", "4294967296"], "kv_cache_memory_mb", 4096),
        (["--no-enable-prefix-caching"], ["--no-enable-prefix-caching"], "enable_prefix_caching", False),
    ],
)
def test_vllm_names_set_the_same_setting(
    ours: list[str], vllms: list[str], field: str, value: object, tmp_path: Path
) -> None:
    first, second = _settings(_serve(*ours), tmp_path), _settings(_serve(*vllms), tmp_path)
    assert getattr(first, field) == getattr(second, field) == value


def test_enable_prefix_caching_takes_both_forms(tmp_path: Path) -> None:
    assert _settings(_serve("--enable-prefix-caching"), tmp_path).enable_prefix_caching is True
    assert _settings(_serve("--no-enable-prefix-caching"), tmp_path).enable_prefix_caching is False
    # The later one wins, as in vLLM.
    on_again = _serve("--no-enable-prefix-caching", "--enable-prefix-caching")
    assert _settings(on_again, tmp_path).enable_prefix_caching is True
    assert _settings(_serve(), tmp_path).enable_prefix_caching is True


@pytest.mark.parametrize(
    ("text", "mib"),
    [("0", 0), ("1048576", 1), ("1", 1), ("512M", 512), ("512MiB", 512), ("1.5G", 1536), ("4g", 3815), ("1k", 1)],
)
def test_vllm_sizes_are_read_as_whole_mib(text: str, mib: int) -> None:
    assert size_in_mib(text) == mib


def test_a_bad_size_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert "not a size in bytes" in _usage_error(["--kv-cache-memory-bytes", "lots"], capsys)


def test_ssl_names_are_the_tls_flags(tmp_path: Path) -> None:
    cert, key, ca = (tmp_path / name for name in ("cert.pem", "key.pem", "ca.pem"))
    for path in (cert, key, ca):
        path.write_text("pem")
    ours = _serve("--tls-cert", str(cert), "--tls-key", str(key), "--tls-ca-cert", str(ca))
    vllms = _serve("--ssl-certfile", str(cert), "--ssl-keyfile", str(key), "--ssl-ca-certs", str(ca))
    assert ours.tls == vllms.tls
    assert vllms.tls is not None and (vllms.tls.cert, vllms.tls.key, vllms.tls.client_ca) == (
        str(cert),
        str(key),
        str(ca),
    )


def test_an_ssl_flag_alone_names_vllms_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cert = tmp_path / "cert.pem"
    cert.write_text("pem")
    assert "--ssl-certfile and --ssl-keyfile" in _usage_error(["--ssl-certfile", str(cert)], capsys)
    missing = str(tmp_path / "nope.pem")
    assert f"--ssl-keyfile: '{missing}' is not a file" in _usage_error(
        ["--ssl-certfile", str(cert), "--ssl-keyfile", missing], capsys
    )


def _adapter(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "adapter_config.json").write_text("{}")
    return folder


def test_lora_modules_takes_several_values_json_and_the_old_flag(tmp_path: Path) -> None:
    sql, chat = _adapter(tmp_path, "sql"), _adapter(tmp_path, "chat")
    expected = {"sql": str(sql.resolve()), "chat": str(chat.resolve())}
    several = _serve("--lora-modules", f"sql={sql}", f"chat={chat}")
    repeated = _serve("--lora-module", f"sql={sql}", "--lora-modules", f"chat={chat}")
    as_json = _serve(
        "--lora-modules",
        json.dumps({"name": "sql", "path": str(sql)}),
        json.dumps({"name": "chat", "path": str(chat)}),
    )
    assert several.lora_modules == repeated.lora_modules == as_json.lora_modules == expected


@pytest.mark.parametrize(
    "item",
    [
        "sql",
        '{"name": "sql"}',
        '{"name": "sql", "path": "/x", "rank": 8}',
        '{"name": "sql", "path": "/x", "base_model_name": "b"}',
        "{broken",
    ],
)
def test_a_bad_lora_module_shows_both_forms(item: str, capsys: pytest.CaptureFixture[str]) -> None:
    err = _usage_error(["--lora-modules", item], capsys)
    assert '--lora-modules takes NAME=DIR or {"name": NAME, "path": DIR}' in err


@pytest.mark.parametrize(
    ("config", "flags"),
    [
        (
            {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 4},
            ["--speculative-ngram-tokens", "3", "--speculative-ngram-min", "1", "--speculative-ngram-max", "4"],
        ),
        ({"method": "ngram", "num_speculative_tokens": 3}, ["--speculative-ngram-tokens", "3"]),
        (
            # One bound alone is both, as in vLLM.
            {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3},
            ["--speculative-ngram-tokens", "2", "--speculative-ngram-min", "3", "--speculative-ngram-max", "3"],
        ),
        (
            {"method": "ngram", "num_speculative_tokens": 4, "disable_by_batch_size": 8},
            ["--speculative-ngram-tokens", "4", "--speculative-disable-by-batch-size", "8"],
        ),
        (
            {"model": "DRAFT", "num_speculative_tokens": 6},
            ["--speculative-model", "DRAFT", "--speculative-model-tokens", "6"],
        ),
        ({"method": "draft_model", "model": "DRAFT"}, ["--speculative-model", "DRAFT"]),
    ],
)
def test_speculative_config_sets_what_the_speculative_flags_set(
    config: dict[str, Any], flags: list[str], tmp_path: Path
) -> None:
    draft = str(tmp_path / "draft")
    text = json.dumps(config).replace("DRAFT", draft)
    from_config = _settings(_serve("--speculative-config", text), tmp_path)
    from_flags = _settings(_serve(*[draft if flag == "DRAFT" else flag for flag in flags]), tmp_path)
    assert from_config == from_flags
    assert from_config != _settings(_serve(), tmp_path)


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ('{"method": "eagle", "model": "x"}', "'method' must be ngram or draft_model, got 'eagle'"),
        ('{"method": "ngram", "num_speculative_tokens": 3, "draft_tensor_parallel_size": 1}', "unknown key "),
        ('{"method": "ngram", "num_speculative_tokens": "3"}', "'num_speculative_tokens' must be an integer"),
        ('{"method": "ngram", "num_speculative_tokens": 0}', "'num_speculative_tokens' must be >= 1, got 0"),
        ('{"method": "ngram"}', "'num_speculative_tokens' is needed with method ngram"),
        ('{"method": "ngram", "num_speculative_tokens": 2, "model": "x"}', "'model' is for method draft_model"),
        ('{"model": "x", "prompt_lookup_max": 3}', "'prompt_lookup_max' is for method ngram"),
        ('{"method": "draft_model"}', "'model' is needed with method draft_model"),
        ('{"num_speculative_tokens": 2}', "'method' is needed"),
        (
            '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 5, "prompt_lookup_max": 3}',
            "'prompt_lookup_min' (5) must be <= 'prompt_lookup_max' (3)",
        ),
        ('{"method": "ngram", "num_speculative_tokens": 2, "disable_by_batch_size": true}', "'disable_by_batch_size'"),
        ("[1]", "must be a JSON object"),
        ("{'method': 'ngram'}", "not valid JSON"),
    ],
)
def test_a_bad_speculative_config_names_the_key(config: str, words: str, capsys: pytest.CaptureFixture[str]) -> None:
    err = _usage_error(["--speculative-config", config], capsys)
    assert "argument --speculative-config" in err and words in err
    if "unknown key" in words:
        assert "'draft_tensor_parallel_size'" in err


def test_speculative_config_does_not_go_with_the_speculative_flags(capsys: pytest.CaptureFixture[str]) -> None:
    err = _usage_error(
        ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2}', "--speculative-ngram-max", "4"],
        capsys,
    )
    assert "--speculative-config replaces --speculative-ngram-max" in err


def test_the_repository_command_takes_the_same_names(tmp_path: Path) -> None:
    options = parse_args(
        [
            "repository",
            str(tmp_path / "repo"),
            "--max-model-len",
            "2048",
            "-tp",
            "1",
            "--speculative-config",
            '{"method": "ngram", "num_speculative_tokens": 2}',
        ]
    )
    assert isinstance(options, RepositoryOptions)
    assert options.engine_overrides == {"max_seq_len": 2048, "tensor_parallel_size": 1, "speculative_ngram_tokens": 2}


def _serve_parser() -> argparse.ArgumentParser:
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    serve = commands.choices["serve"]
    assert isinstance(serve, argparse.ArgumentParser)
    return serve


def test_serve_help_shows_vllms_names_and_the_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--help"])
    assert exit_info.value.code == 0
    shown = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for name in (
        "--max-model-len",
        "-tp",
        "--enable-prefix-caching, --no-enable-prefix-caching",
        "--kv-cache-memory-bytes",
        "--lora-modules",
        "--speculative-config",
        "--ssl-keyfile",
        "--ssl-certfile",
        "--ssl-ca-certs",
        "--allowed-local-media-path",
        "--uvicorn-log-level",
    ):
        assert name in shown
    for default in (
        "sequences in the running batch at most (default: 64)",
        "prompt tokens prefilled per step (default: 512)",
        "default and cap of max_tokens (default: 512)",
        "(default: 127.0.0.1)",
        "(default: 8000)",
        "(default: /data/multimodal_inputs/)",
        "(default: info)",
    ):
        assert default in shown
    assert "python_backend/protocol/settings" not in shown


def test_every_serve_flag_says_its_default() -> None:
    unsaid = [
        action.option_strings[0]
        for action in _serve_parser()._actions
        if action.option_strings and action.dest != "help" and "default" not in (action.help or "")
    ]
    assert not unsaid


def test_allowed_local_media_path_is_where_file_media_is_read(tmp_path: Path) -> None:
    root = tmp_path / "media"
    root.mkdir()
    (root / "cat.png").write_bytes(b"png bytes")
    (tmp_path / "secret.png").write_bytes(b"outside")
    options = parse_args(
        [
            "frontend",
            "--triton-url",
            "127.0.0.1:8001",
            "--served-model-name",
            "m",
            "--allowed-local-media-path",
            str(root),
        ]
    )
    assert isinstance(options, FrontendOptions)
    media = frontend_settings(options).media
    assert media.media_root == str(root.resolve())
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "file://cat.png"}}]}]
    source = extract_media(messages, media).refs[0].source
    assert isinstance(source, LocalSource)
    assert read_local_file(source.components, media.media_root, 1024) == b"png bytes"
    outside = [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": f"file://{tmp_path}/secret.png"}}]}
    ]
    with pytest.raises(ContractError):
        extract_media(outside, media)
    with pytest.raises(MediaError):
        local_components("../secret.png", media.media_root)


def test_the_media_folder_defaults_to_the_frontends_and_must_exist(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _serve().media_root == MediaSettings().media_root
    missing = tmp_path / "absent"
    assert f"--allowed-local-media-path: '{missing}' is not a folder" in _usage_error(
        ["--allowed-local-media-path", str(missing)], capsys
    )


def test_log_level_sets_the_launchers_uvicorns_and_the_frontends(capsys: pytest.CaptureFixture[str]) -> None:
    assert _serve("--uvicorn-log-level", "warning").log_level == _serve("--log-level", "warning").log_level == "warning"
    assert _serve().log_level == "info"
    logger = logging.getLogger("test.launcher.level")
    configure_launcher_logging(logger, "text", "warning")
    try:
        logger.info("hidden")
        logger.warning("shown")
    finally:
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
    assert capsys.readouterr().err == "triton-chat: shown\n"
    # Default text logging keeps uvicorn's own config; other levels configure the frontend's too.
    assert uvicorn_log_config("text") is None
    names = ("uvicorn", "uvicorn.error", "uvicorn.access", "openai_frontend")
    loggers = [logging.getLogger(name) for name in names]
    saved = [(one, one.handlers[:], one.level, one.propagate) for one in loggers]
    try:
        for level, frontend in (("debug", logging.DEBUG), ("error", logging.ERROR), ("info", logging.WARNING)):
            for log_format in ("text", "json"):
                config = uvicorn_log_config(log_format, level)
                if config is None:
                    continue
                logging.config.dictConfig(config)
                assert logging.getLogger("openai_frontend").level == frontend
                assert logging.getLogger("uvicorn.access").level == logging.getLevelName(level.upper())
    finally:
        for one, handlers, level_before, propagate in saved:
            one.handlers, one.propagate = handlers, propagate
            one.setLevel(level_before)


def test_uvicorn_runs_at_the_log_level() -> None:
    from openai_frontend.app import create_app
    from openai_frontend.launcher.draining_server import draining_server
    from openai_frontend.settings import FrontendSettings

    app = create_app(FrontendSettings(served_model_name="m"))
    server = draining_server(app, "127.0.0.1", 8000, None, 0, "warning")
    assert server.config.log_level == "warning"
