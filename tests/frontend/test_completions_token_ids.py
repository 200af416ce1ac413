"""``/v1/completions`` with the prompt as token ids (a list, or lists), against a scripted backend:
the ids go to the model as they are, errors name the prompt's place, echo shows their text."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from frontend_fakes import MODEL, PIECES, FakeBackend, choice_deltas
from test_chat_stream import parse_sse
from test_completions import TEXT, openai_client, post
from test_request_errors import assert_envelope

from openai_frontend.client.base import BackendError, BackendRequest
from python_backend.protocol.contract import ChoiceDelta
from python_backend.protocol.errors import ErrorInfo
from python_backend.protocol.tokenize import DetokenizeAnswer, DetokenizeQuery

HI = [72, 105]  # "Hi" for the fake backend's detokenizer (one id per character)


def body(prompt: Any, **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, **fields}


async def test_a_list_of_ids_is_one_prompt_sent_as_ids() -> None:
    backend = FakeBackend()
    response = await post(backend, body(HI))
    assert response.status_code == 200 and response.json()["choices"][0]["text"] == TEXT
    [request] = backend.requests
    assert (request.prompt_token_ids, request.prompt, request.messages) == (tuple(HI), None, [])
    assert backend.queries == []  # no echo: nothing to detokenize


async def test_lists_of_ids_are_one_prompt_each() -> None:
    backend = FakeBackend()
    response = await post(backend, body([HI, [1, 2, 3]], n=2, temperature=1))
    assert [c["index"] for c in response.json()["choices"]] == [0, 1, 2, 3]
    assert sorted(r.prompt_token_ids or () for r in backend.requests) == [(1, 2, 3), tuple(HI)]


@pytest.mark.parametrize(
    ("prompt", "param"),
    [
        ([[]], "prompt.0"),
        ([HI, []], "prompt.1"),
        ([1, -2], "prompt.1"),
        ([1, 2.5], "prompt.1"),
        ([1, True], "prompt.1"),
        ([1, 1 << 31], "prompt.1"),
        ([[1], [2, "x"]], "prompt.1.1"),
        ([[1], 2], "prompt.1"),
        (["text", [1]], "prompt.1"),
    ],
)
async def test_bad_ids_are_a_400_naming_the_element(prompt: Any, param: str) -> None:
    backend = FakeBackend()
    assert_envelope(await post(backend, body(prompt)), 400, param)
    assert backend.requests == []


def outside_vocabulary(req: BackendRequest) -> Sequence[ChoiceDelta | BackendError]:
    """The model's answer to an id outside its vocabulary (the last id of the second prompt)."""
    ids = req.prompt_token_ids or ()
    if ids != (7, 99999):
        return choice_deltas(0, PIECES)
    message = "'prompt_token_ids.1' is 99999, outside the vocabulary (ids 0 to 4095)"
    return [BackendError(ErrorInfo(400, message, "invalid_request_error", "prompt_token_ids.1"))]


@pytest.mark.parametrize(
    ("prompt", "param", "stream"),
    [([7, 99999], "prompt.1", False), ([7, 99999], "prompt.1", True), ([HI, [7, 99999]], "prompt.1.1", False)],
)
async def test_the_models_vocabulary_error_names_the_prompt_element(prompt: Any, param: str, stream: bool) -> None:
    response = await post(FakeBackend(script=outside_vocabulary), body(prompt, stream=stream))
    error = assert_envelope(response, 400, param)
    assert error["message"] == f"'{param}' is 99999, outside the vocabulary (ids 0 to 4095)"


async def test_echo_starts_with_the_text_of_the_ids() -> None:
    backend = FakeBackend()
    whole = await post(backend, body(HI, echo=True))
    streamed = await post(backend, body(HI, echo=True, stream=True), openai_mode="openai")
    assert whole.json()["choices"][0]["text"] == "Hi" + TEXT
    texts = [c["choices"][0]["text"] for c in parse_sse(streamed.text) if c["choices"]]
    assert texts[0] == "Hi" + PIECES[0] and "".join(texts) == "Hi" + TEXT
    assert backend.queries == [DetokenizeQuery(HI), DetokenizeQuery(HI)]
    assert all(r.prompt_token_ids == tuple(HI) for r in backend.requests)


class NoSuchToken(FakeBackend):
    """Its detokenizer knows no id above 1000, as a model's vocabulary would refuse it."""

    async def detokenize(self, query: DetokenizeQuery) -> DetokenizeAnswer:
        for i, token in enumerate(query.tokens):
            if token > 1000:
                message = f"'tokens.{i}' is {token}, outside the vocabulary (0..1000)"
                raise BackendError(ErrorInfo(400, message, "invalid_request_error", f"tokens.{i}"))
        return await super().detokenize(query)


async def test_echo_of_an_id_outside_the_vocabulary_names_the_prompt_element() -> None:
    backend = NoSuchToken()
    error = assert_envelope(await post(backend, body([HI, [5, 5000]], echo=True)), 400, "prompt.1.1")
    assert error["message"] == "'prompt.1.1' is 5000, outside the vocabulary (0..1000)"
    assert backend.requests == []  # refused before generating


async def test_the_openai_client_sends_token_ids() -> None:
    backend = FakeBackend()
    async with openai_client(backend, openai_mode="openai") as client:
        whole = await client.completions.create(model=MODEL, prompt=HI, echo=True)
        nested = await client.completions.create(model=MODEL, prompt=[HI, HI])
    assert whole.choices[0].text == "Hi" + TEXT
    assert [c.index for c in nested.choices] == [0, 1]
    assert [r.prompt_token_ids for r in backend.requests] == [tuple(HI)] * 3
