"""Stop strings across token boundaries and UTF-8-safe incremental detokenization."""

from __future__ import annotations

import pytest

from python_backend.text.detokenizer import IncrementalDetokenizer
from python_backend.text.stop_strings import StopStringMatcher


def feed_all(matcher: StopStringMatcher, pieces: list[str]) -> tuple[str, bool]:
    out, stopped = "", False
    for piece in pieces:
        result = matcher.feed(piece)
        out += result.text
        if result.stopped:
            return out, True
    return out + matcher.flush(), stopped


@pytest.mark.parametrize(
    ("pieces", "stops", "expected"),
    [
        (["Hel", "lo ST", "OP here"], ("STOP",), "Hello "),
        (["a", "b", "c"], ("bc",), "a"),
        (["xS", "T", "x"], ("STOP",), "xSTx"),  # a prefix that turned out not to be a stop
        (["one END two"], ("END", "one"), ""),  # the earliest match wins
        (["no stops"], (), "no stops"),
    ],
)
def test_stop_strings(pieces: list[str], stops: tuple[str, ...], expected: str) -> None:
    assert feed_all(StopStringMatcher(stops, include_stop=False), pieces)[0] == expected


def test_held_text_never_includes_a_partial_stop() -> None:
    matcher = StopStringMatcher(("</end>",), include_stop=False)
    assert matcher.feed("answer </e").text == "answer "
    assert matcher.feed("n").text == ""
    result = matcher.feed("d> tail")
    assert result.stopped and result.text == ""


def test_include_stop_string() -> None:
    out, stopped = feed_all(StopStringMatcher(("STOP",), include_stop=True), ["go ST", "OP now"])
    assert stopped and out == "go STOP"


TEXTS = ["héllo wörld", "你好，世界！", "emoji 😀🎉 mix ✓", "Ünïcödé — dash"]


@pytest.mark.parametrize("text", TEXTS)
def test_detokenizer_never_splits_a_character(tiny_tokenizer, text: str) -> None:
    ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tiny_tokenizer, tiny_tokenizer.encode("prompt:", add_special_tokens=False), True)
    deltas = [detok.add(i) for i in ids] + [detok.flush()]
    assert "".join(deltas) == tiny_tokenizer.decode(ids)
    assert all("\ufffd" not in d for d in deltas)


def test_detokenizer_splits_multibyte_tokens_somewhere(tiny_tokenizer) -> None:
    # The fixture must really split some character over several tokens, or the test above is empty.
    split = 0
    for text in TEXTS:
        for i in tiny_tokenizer.encode(text, add_special_tokens=False):
            if "\ufffd" in tiny_tokenizer.decode([i]):
                split += 1
    assert split > 0


def test_detokenizer_skips_special_tokens(tiny_tokenizer) -> None:
    end = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = tiny_tokenizer.encode("ok", add_special_tokens=False) + [end]
    skip = IncrementalDetokenizer(tiny_tokenizer, [], True)
    keep = IncrementalDetokenizer(tiny_tokenizer, [], False)
    assert "".join(skip.add(i) for i in ids) + skip.flush() == "ok"
    assert "".join(keep.add(i) for i in ids) + keep.flush() == "ok<|im_end|>"
