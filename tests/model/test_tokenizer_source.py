"""vLLM's --tokenizer, --chat-template and --seed as the model applies them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from python_backend.model.loader import seed_source
from python_backend.model.tokenizer import TokenizerError, load_tokenizer
from python_backend.protocol.settings import EngineSettings
from python_backend.protocol.settings.template_source import ChatTemplateError, chat_template_text

TEMPLATE = "{% for m in messages %}<<{{ m.role }}>>{{ m.content }}\n{% endfor %}"


def _settings(model: Path, **values: str) -> EngineSettings:
    return EngineSettings(model_path=str(model), dtype="float32", **values)  # type: ignore[arg-type]


def _render(tokenizer, text: str = "hi") -> str:  # noqa: ANN001
    return str(tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False))


def test_a_template_file_replaces_the_tokenizers(tiny_model_dir: Path, tmp_path: Path) -> None:
    file = tmp_path / "template.jinja"
    file.write_text(TEMPLATE)
    tokenizer = load_tokenizer(_settings(tiny_model_dir, chat_template=str(file)), tiny_model_dir)
    assert _render(tokenizer) == "<<user>>hi\n"


def test_a_one_line_template_has_its_newline_escapes_decoded(tiny_model_dir: Path) -> None:
    literal = TEMPLATE.replace("\n", "\\n")
    tokenizer = load_tokenizer(_settings(tiny_model_dir, chat_template=literal), tiny_model_dir)
    assert _render(tokenizer, "wörld ✓") == "<<user>>wörld ✓\n"


def test_a_bad_template_is_a_load_error_naming_the_flag(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match=r"--chat-template.*cannot be read"):
        load_tokenizer(_settings(tiny_model_dir, chat_template=str(tmp_path / "missing.jinja")), tiny_model_dir)
    with pytest.raises(TokenizerError, match="--chat-template"):
        load_tokenizer(_settings(tiny_model_dir, chat_template="{% for m in messages %}"), tiny_model_dir)


def test_template_source_follows_vllms_rule(tmp_path: Path) -> None:
    with pytest.raises(ChatTemplateError, match="looks like a file's path"):
        chat_template_text("templates/chatml.jinja")
    empty = tmp_path / "empty.jinja"
    empty.write_text("  ")
    with pytest.raises(ChatTemplateError, match="empty"):
        chat_template_text(str(empty))
    assert chat_template_text("{{ x }}\\n") == "{{ x }}\n"


def test_a_tokenizer_folder_is_used_instead_of_the_models(tiny_model_dir: Path, tmp_path: Path) -> None:
    # The model folder loses its tokenizer files and template; the other folder has them, with a
    # template of its own that shows which one rendered.
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    other = tmp_path / "tokenizer"
    other.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (model / name).is_file():
            shutil.move(str(model / name), str(other / name))
    (model / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((other / "tokenizer_config.json").read_text())
    config["chat_template"] = "TOKENIZER-FOLDER {{ messages[0].content }}"
    (other / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = load_tokenizer(_settings(model, tokenizer=str(other)), model)
    assert _render(tokenizer) == "TOKENIZER-FOLDER hi"
    with pytest.raises(TokenizerError, match="--tokenizer"):
        load_tokenizer(_settings(model, tokenizer=str(tmp_path / "nowhere")), model)


def test_the_seed_source_repeats_with_a_seed_and_not_without() -> None:
    first, second = seed_source(1234), seed_source(1234)
    assert [first.getrandbits(64) for _ in range(3)] == [second.getrandbits(64) for _ in range(3)]
    assert seed_source(1).getrandbits(64) != seed_source(2).getrandbits(64)
    assert seed_source(-1).getrandbits(64) != seed_source(-1).getrandbits(64)
