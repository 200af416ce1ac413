"""Streaming chat completions in MindIE mode: SSE framing, formats 2/3/4, errors mid-stream (§4.5)."""

from __future__ import annotations

import json

from frontend_fakes import (
    MODEL,
    PIECES,
    PROMPT_TOKENS,
    FakeBackend,
    backend_error,
    chat_body,
    choice_deltas,
    client_for,
    fixed,
)

from python_backend.protocol.contract import ChoiceDelta


def parse_sse(text: str) -> list[dict]:
    """Check the exact framing (``data: <json>`` + blank line, ending with ``[DONE]``); return chunks."""
    assert text.endswith("data: [DONE]\n\n")
    events = text.split("\n\n")
    assert events[-1] == ""
    events = events[:-1]
    assert all(event.startswith("data: ") and "\n" not in event for event in events)
    assert events[-1] == "data: [DONE]"
    return [json.loads(event[len("data: ") :]) for event in events[:-1]]


async def test_format3_exact_framing_and_final_usage() -> None:
    async with client_for(FakeBackend()) as client:
        response = await client.post("/v1/chat/completions", json=chat_body(stream=True))
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    chunks = parse_sse(response.text)
    assert len(chunks) == len(PIECES)
    ids = {c["id"] for c in chunks}
    assert len(ids) == 1 and ids.pop().startswith("chatcmpl-")
    for i, chunk in enumerate(chunks):
        last = i == len(chunks) - 1
        assert chunk["object"] == "chat.completion.chunk"
        assert chunk["model"] == MODEL
        assert len(chunk["choices"]) == 1
        choice = chunk["choices"][0]
        assert "logprobs" not in choice  # format 3: no n, no logprobs
        assert choice["index"] == 0
        assert choice["delta"] == {"role": "assistant", "content": PIECES[i]}
        assert choice["finish_reason"] == ("stop" if last else None)
        assert ("usage" in chunk) == last
        assert "prefill_time" not in chunk and "decode_time_arr" not in chunk
        assert "full_text" not in chunk
    assert list(chunks[-1]) == ["id", "object", "created", "model", "usage", "choices"]
    usage = chunks[-1]["usage"]
    assert usage == {
        "prompt_tokens": PROMPT_TOKENS,
        "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens": len(PIECES),
        "total_tokens": PROMPT_TOKENS + len(PIECES),
        "batch_size": [1] * len(PIECES),
        "queue_wait_time": [5000 + i for i in range(len(PIECES))],
    }


async def test_format2_n2_interleaved_with_per_choice_usage() -> None:
    async with client_for(FakeBackend()) as client:
        response = await client.post(
            "/v1/chat/completions", json=chat_body(stream=True, n=2, best_of=2, temperature=0.8)
        )
    chunks = parse_sse(response.text)
    indices = [c["choices"][0]["index"] for c in chunks]
    assert indices[:4] == [0, 1, 0, 1]  # token-by-token interleaving
    assert all(len(c["choices"]) == 1 for c in chunks)
    assert all(c["choices"][0]["logprobs"] is None for c in chunks)  # format 2 has the key
    finals = [c for c in chunks if c["choices"][0]["finish_reason"] is not None]
    assert [c["choices"][0]["index"] for c in finals] == [1, 0]
    for final in finals:
        index = final["choices"][0]["index"]
        tokens = len(PIECES) - index
        usage = final["usage"]
        assert usage["completion_tokens"] == tokens  # that choice's own count
        assert usage["total_tokens"] == PROMPT_TOKENS + tokens
        assert len(usage["batch_size"]) == len(usage["queue_wait_time"]) == tokens
        assert usage["prompt_tokens_details"] == {"cached_tokens": 0}  # always present, 0 without a cache hit
    assert sum("usage" in c for c in chunks) == 2
    texts = {0: "", 1: ""}
    for chunk in chunks:
        texts[chunk["choices"][0]["index"]] += chunk["choices"][0]["delta"]["content"]
    assert texts == {0: "".join(PIECES), 1: "".join(PIECES[:-1])}


async def test_logprobs_stream_carries_logprobs_objects() -> None:
    async with client_for(FakeBackend()) as client:
        response = await client.post("/v1/chat/completions", json=chat_body(stream=True, logprobs=True))
    chunks = parse_sse(response.text)
    for chunk, piece in zip(chunks, PIECES, strict=True):
        content = chunk["choices"][0]["logprobs"]["content"]
        assert [t["token"] for t in content] == [piece]


async def test_full_text_enabled_streams_cumulative_text() -> None:
    async with client_for(FakeBackend(), full_text_enabled=True) as client:
        response = await client.post("/v1/chat/completions", json=chat_body(stream=True))
    chunks = parse_sse(response.text)
    expected = ["".join(PIECES[: i + 1]) for i in range(len(PIECES))]
    assert [c["choices"][0]["delta"]["content"] for c in chunks] == expected
    assert all("full_text" not in c for c in chunks[:-1])
    assert chunks[-1]["full_text"] == "".join(PIECES)
    assert list(chunks[-1]) == ["id", "object", "created", "model", "full_text", "usage", "choices"]


async def test_empty_non_final_deltas_make_no_chunk() -> None:
    def script(_req):
        deltas = choice_deltas(0, ["a", "b"])
        return [ChoiceDelta(0), deltas[0], ChoiceDelta(0), deltas[1]]

    async with client_for(FakeBackend(script=script)) as client:
        response = await client.post("/v1/chat/completions", json=chat_body(stream=True))
    chunks = parse_sse(response.text)
    assert [c["choices"][0]["delta"]["content"] for c in chunks] == ["a", "b"]


async def test_backend_error_mid_stream_ends_with_err_msg_then_done() -> None:
    def script(_req):
        return [*choice_deltas(0, ["a", "b", "c"])[:2], backend_error(500, "engine failed", "engine_error")]

    backend = FakeBackend(script=script)
    async with client_for(backend) as client:
        response = await client.post("/v1/chat/completions", json=chat_body(stream=True))
    assert response.status_code == 200
    chunks = parse_sse(response.text)
    assert [c["choices"][0]["delta"]["content"] for c in chunks[:2]] == ["a", "b"]
    last = chunks[-1]
    assert last["err_msg"] == "engine failed"
    assert last["choices"][0]["finish_reason"] == "stop"
    assert last["choices"][0]["delta"]["role"] == "assistant"
    assert backend.endings == ["error"]


async def test_backend_error_before_first_byte_is_http_error_with_retry_after() -> None:
    script = fixed([backend_error(429, "too many requests", "rate_limit_exceeded", "rate_limit_exceeded")])
    async with client_for(FakeBackend(script=script)) as client:
        streamed = await client.post("/v1/chat/completions", json=chat_body(stream=True))
        plain = await client.post("/v1/chat/completions", json=chat_body())
    for response in (streamed, plain):
        assert response.status_code == 429
        assert response.headers["retry-after"] == "1"
        assert response.headers["content-type"] == "application/json"
        assert response.json() == {
            "error": {
                "message": "too many requests",
                "type": "rate_limit_exceeded",
                "param": None,
                "code": "rate_limit_exceeded",
            }
        }


async def test_backend_400_on_first_response_is_http_400() -> None:
    script = fixed([backend_error(400, "prompt is too long", "context_length_exceeded")])
    async with client_for(FakeBackend(script=script)) as client:
        response = await client.post("/v1/chat/completions", json=chat_body(stream=True))
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "context_length_exceeded"


async def test_backend_ending_before_any_event_is_http_500() -> None:
    async with client_for(FakeBackend(script=fixed([ChoiceDelta(0)]))) as client:
        response = await client.post("/v1/chat/completions", json=chat_body(stream=True))
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "backend_incomplete"


async def test_backend_ending_mid_stream_ends_unfinished_choices_with_err_msg() -> None:
    first = choice_deltas(0, ["a", "b"])
    second = choice_deltas(1, ["c", "d"])
    script = fixed([first[0], second[0], second[1]])  # choice 0 never finishes
    async with client_for(FakeBackend(script=script)) as client:
        response = await client.post("/v1/chat/completions", json=chat_body(stream=True, n=2, temperature=1))
    chunks = parse_sse(response.text)
    last = chunks[-1]
    assert last["choices"][0]["index"] == 0 and last["choices"][0]["finish_reason"] == "stop"
    assert last["err_msg"] == "model backend ended the response early"
    assert sum("err_msg" in c for c in chunks) == 1  # choice 1 had finished normally


def test_a_running_chunk_is_exact_compact_json() -> None:
    from openai_frontend.chat.sse import StreamFormatter, StreamOptions

    options = StreamOptions("chatcmpl-1", 1700000000, 'm"1', 1, False, True, False, False)
    formatter = StreamFormatter(options)
    event = formatter.on_delta(ChoiceDelta(0, text='é "q"\n'))
    assert event == [
        'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"m\\"1",'
        '"choices":[{"index":0,"delta":{"role":"assistant","content":"é \\"q\\"\\n"},"finish_reason":null}]}\n\n'.encode()
    ]
    openai = StreamFormatter(StreamOptions("c", 1, "m", 1, False, False, False, False))
    role, text = openai.on_delta(ChoiceDelta(0, text="x"))
    assert json.loads(role[6:]) == {
        "id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}],
    }  # fmt: skip
    assert json.loads(text[6:])["choices"][0]["delta"] == {"content": "x"}


def test_text_with_unicode_line_separators_stays_one_line_for_httpx_clients() -> None:
    """U+2028, U+2029 and U+0085 end a line for str.splitlines, which httpx's ``iter_lines`` (what
    many SSE clients read with) follows; sent raw inside a JSON string, a model that writes one cut
    that client's event in two. Escaped, the client reads the same text in one line."""
    from httpx._decoders import LineDecoder

    from openai_frontend.chat.sse import StreamFormatter, StreamOptions

    text = "a\u2028b\u2029c\x85d é"
    formatter = StreamFormatter(StreamOptions("c", 1, "m\u2028", 1, False, True, False, False))
    (event,) = formatter.on_delta(ChoiceDelta(0, text=text))
    decoder = LineDecoder()
    lines = [line for line in decoder.decode(event.decode("utf-8")) + decoder.flush() if line]
    assert len(lines) == 1, lines
    chunk = json.loads(lines[0].removeprefix("data: "))
    assert chunk["choices"][0]["delta"]["content"] == text and chunk["model"] == "m\u2028"
    assert "é".encode() in event  # other non-ASCII text stays raw UTF-8, as before
