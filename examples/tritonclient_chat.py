"""Chat with the triton_chat model directly over Triton's gRPC API, no frontend involved.

    python examples/tritonclient_chat.py --url 127.0.0.1:8001 "What is the capital of France?"

Streams the answer to stdout as it is generated, then prints the usage of the choice.
"""

from __future__ import annotations

import argparse
import json
import queue
import sys

import numpy as np
import tritonclient.grpc as grpcclient


def bytes_input(name: str, text: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, [1], "BYTES")
    tensor.set_data_from_numpy(np.array([text.encode("utf-8")], dtype=np.object_))
    return tensor


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("question")
    parser.add_argument("--url", default="127.0.0.1:8001", help="Triton's gRPC address")
    parser.add_argument("--model", default="triton_chat", help="the Triton model name")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()

    messages = [{"role": "user", "content": args.question}]
    parameters = {"max_tokens": args.max_tokens, "temperature": 0}
    stream = grpcclient.InferInput("stream", [1], "BOOL")
    stream.set_data_from_numpy(np.array([True]))
    inputs = [
        bytes_input("messages", json.dumps(messages)),
        bytes_input("generation_parameters", json.dumps(parameters)),
        stream,
    ]

    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(args.url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        client.async_stream_infer(args.model, inputs, enable_empty_final_response=True)
        while True:
            result, error = responses.get(timeout=300)
            if error is not None:
                # Errors carry a JSON envelope: {"error": {"status", "message", "param", ...}}.
                sys.stderr.write(f"error: {error}\n")
                return 1
            response = result.get_response()
            if response.outputs:
                sys.stdout.write(result.as_numpy("text_output")[0].decode("utf-8"))
                sys.stdout.flush()
                # Outputs other than text_output are sent only when they say something: usage,
                # finish_reason and the token counts come with a choice's last response.
                usage = result.as_numpy("usage")
                if usage is not None:
                    finish = result.as_numpy("finish_reason")[0].decode("utf-8")
                    sys.stdout.write(f"\n[finish_reason={finish}] usage: {usage[0].decode('utf-8')}\n")
            if response.parameters["triton_final_response"].bool_param:
                return 0
    finally:
        client.stop_stream()
        client.close()


if __name__ == "__main__":
    sys.exit(main())
