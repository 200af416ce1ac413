"""Non-streaming chat completions in MindIE mode: body shape and usage invariants (§4.4, decisions 4-6)."""

from __future__ import annotations

from frontend_fakes import (
    MODEL,
    PIECES,
    PROMPT_TOKENS,
    FakeBackend,
    chat_body,
    choice_deltas,
    client_for,
    fixed,
    interleave,
)

from python_backend.protocol.contract import ChoiceDelta
from python_backend.protocol.params import parse_parameters


def _check_invariants(usage: dict, decode_time_arr: list) -> None:
    assert len(usage["batch_size"]) == len(usage["queue_wait_time"])
    assert len(decode_time_arr) == max(len(usage["batch_size"]) - 1, 0)
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}


async def test_single_choice_body_shape() -> None:
    backend = FakeBackend()
    async with client_for(backend) as client:
        response = await client.post("/v1/chat/completions", json=chat_body(max_tokens=16))
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert "x-ignored-params" not in response.headers
    body = response.json()
    assert list(body) == ["id", "object", "created", "model", "choices", "usage", "prefill_time", "decode_time_arr"]
    assert body["id"].startswith("chatcmpl-") and len(body["id"]) == len("chatcmpl-") + 32
    assert body["object"] == "chat.completion"
    assert isinstance(body["created"], int) and body["created"] > 1_600_000_000
    assert body["model"] == MODEL
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "".join(PIECES), "tool_calls": []},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ]
    usage = body["usage"]
    assert list(usage) == [
        "prompt_tokens",
        "prompt_tokens_details",
        "completion_tokens",
        "total_tokens",
        "batch_size",
        "queue_wait_time",
    ]
    assert usage["prompt_tokens"] == PROMPT_TOKENS
    assert usage["completion_tokens"] == len(PIECES)
    assert len(usage["batch_size"]) == len(PIECES)
    _check_invariants(usage, body["decode_time_arr"])
    assert body["prefill_time"] > 0
    # The backend got the allow-listed parameters, and was asked for the whole answer at once.
    request = backend.requests[0]
    assert request.parameters == {"max_tokens": 16}
    assert request.stream is False
    assert request.request_id == body["id"]
    assert backend.endings == ["finished"]


async def test_n2_usage_sums_tokens_and_takes_arrays_from_longest() -> None:
    async with client_for(FakeBackend()) as client:
        response = await client.post("/v1/chat/completions", json=chat_body(n=2, temperature=0.7))
    body = response.json()
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert body["choices"][1]["message"]["content"] == "".join(PIECES[:-1])
    usage = body["usage"]
    assert usage["completion_tokens"] == len(PIECES) + len(PIECES) - 1  # total over choices
    assert usage["total_tokens"] == PROMPT_TOKENS + usage["completion_tokens"]
    assert len(usage["batch_size"]) == len(PIECES)  # the longest choice
    assert usage["batch_size"] == [2] * len(PIECES)
    assert len(body["decode_time_arr"]) == len(PIECES) - 1
    assert body["prefill_time"] == 20.5 + len(PIECES)  # the largest of the choices'


async def test_best_of_greater_than_n_returns_n_choices_as_sent() -> None:
    async with client_for(FakeBackend()) as client:
        response = await client.post("/v1/chat/completions", json=chat_body(n=1, best_of=3, temperature=0.7))
    assert response.status_code == 200
    assert len(response.json()["choices"]) == 1


async def test_logprobs_reasoning_and_tool_calls() -> None:
    def script(_req):
        deltas = choice_deltas(0, ["Sun", "ny"], with_logprobs=True, reasoning=["think", "ing"], finish="tool_calls")
        deltas.insert(
            -1,
            ChoiceDelta(
                0,
                tool_calls=[
                    {
                        "index": 0,
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city": '},
                    }
                ],
            ),
        )
        deltas.insert(-1, ChoiceDelta(0, tool_calls=[{"index": 0, "function": {"arguments": '"Paris"}'}}]))
        return deltas

    async with client_for(FakeBackend(script=script)) as client:
        response = await client.post("/v1/chat/completions", json=chat_body(logprobs=True, top_logprobs=2))
    body = response.json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] == "Sunny"
    assert message["reasoning_content"] == "thinking"
    assert message["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}
    ]
    tokens = choice["logprobs"]["content"]
    assert [t["token"] for t in tokens] == ["Sun", "ny"]
    assert tokens[0]["bytes"] == list(b"Sun") and tokens[0]["logprob"] == -0.25
    assert [t["token"] for t in tokens[0]["top_logprobs"]] == ["Sun", "x"]
    assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": 2}


async def test_lora_model_name_sets_lora_parameter() -> None:
    backend = FakeBackend()
    async with client_for(backend) as client:
        response = await client.post("/v1/chat/completions", json=chat_body(model="tiny-lora"))
    assert response.status_code == 200
    assert response.json()["model"] == "tiny-lora"
    assert backend.requests[0].parameters == {"lora": "tiny-lora"}


async def test_beam_search_stream_is_one_json_body() -> None:
    """Format 1: stream=true with beam search answers one chat.completion object."""
    script = fixed(
        interleave(
            choice_deltas(0, ["You", " are"], finish="length"), choice_deltas(1, ["You", " were"], finish="length")
        )
    )
    async with client_for(FakeBackend(script=script)) as client:
        response = await client.post(
            "/v1/chat/completions", json=chat_body(stream=True, use_beam_search=True, n=2, best_of=2)
        )
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert not response.text.startswith("data:")
    body = response.json()
    assert body["object"] == "chat.completion"
    assert [c["message"]["content"] for c in body["choices"]] == ["You are", "You were"]
    assert [c["finish_reason"] for c in body["choices"]] == ["length", "length"]
    assert body["usage"]["completion_tokens"] == 4
    _check_invariants(body["usage"], body["decode_time_arr"])


async def test_backend_ending_early_is_a_500_envelope() -> None:
    script = fixed([ChoiceDelta(0, text="half")])  # no finish_reason ever
    async with client_for(FakeBackend(script=script)) as client:
        response = await client.post("/v1/chat/completions", json=chat_body())
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "backend_incomplete"


async def test_large_body_is_validated_off_the_event_loop() -> None:
    big = "word " * 100_000  # 500 kB of message text
    async with client_for(FakeBackend()) as client:
        ok = await client.post("/v1/chat/completions", json=chat_body(messages=[{"role": "user", "content": big}]))
        bad = await client.post(
            "/v1/chat/completions", json=chat_body(messages=[{"role": "user", "content": big}], n=0)
        )
    assert ok.status_code == 200
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "n"


async def test_the_backend_gets_the_parsed_parameters_not_the_bodys_spelling() -> None:
    backend = FakeBackend()
    body = chat_body(max_completion_tokens=8, top_k=-1, temperature=1, repetition_penalty=1.0, stop="END")
    async with client_for(backend) as client:
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    assert backend.requests[0].parameters == {"temperature": 1.0, "top_k": 0, "stop": ["END"], "max_tokens": 8}
    assert parse_parameters(backend.requests[0].parameters) == parse_parameters(
        {"max_completion_tokens": 8, "top_k": -1, "temperature": 1, "stop": "END"}
    )
