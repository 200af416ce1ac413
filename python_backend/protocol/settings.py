"""Engine settings: what the model reads from its ``config.pbtxt`` parameters.

Owns: ``EngineSettings`` (typed, validated, with documented defaults) and its conversion from and
to Triton's string-valued config parameters, so the launcher writes exactly what the model reads.
No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

DTYPES = ("auto", "bfloat16", "float16", "float32")
# The tool-call formats the model can parse (python_backend.text.tool_parsers implements each).
HERMES = "hermes"
CHATGLM3 = "chatglm3"
TOOL_PARSERS = (HERMES, CHATGLM3)
TOOL_CALL_PARSER_CHOICES = ("auto", *TOOL_PARSERS, "none")
REASONING_PARSER_CHOICES = ("auto", "think", "none")
KV_CACHE_DTYPE_CHOICES = ("auto", "model")


class SettingsError(ValueError):
    """A bad engine setting; the message names the key."""


@dataclass(frozen=True)
class EngineSettings:
    """Engine configuration. Every field is a ``config.pbtxt`` parameter of the same name."""

    model_path: str = ""  # local Hugging Face folder; required
    served_model_name: str = ""  # name clients use; default: the folder's name
    dtype: str = "auto"  # auto | bfloat16 | float16 | float32 (auto: the folder's torch_dtype)
    device: str = "auto"  # auto | cpu | cuda[:N] | npu[:N]
    max_num_seqs: int = 32  # sequences in the running batch at most
    max_num_batched_tokens: int = 512  # prompt tokens prefilled per step (chunked prefill)
    max_waiting_requests: int = 256  # queued requests beyond which new ones get "overloaded"
    kv_cache_memory_mb: int = 0  # KV-cache budget; 0 = automatic (a share of free memory)
    # Keep the keys/values of recent prompts and reuse them for prompts that start the same way
    # (a shared system prompt, earlier turns of a chat): prefix_cache.py.
    enable_prefix_caching: bool = True
    prefix_cache_memory_mb: int = 0  # memory for it; 0 = automatic (an eighth of the KV budget)
    max_seq_len: int = 0  # maxSeqLen: prompt + output tokens; 0 = the model's context length
    max_input_token_len: int = 0  # maxInputTokenLen; 0 = max_seq_len - 1
    max_iter_times: int = 512  # maxIterTimes: default and cap of max_tokens
    torch_threads: int = 0  # intra-op threads on CPU; 0 = torch's default
    # Tokens per streamed response (vLLM's --stream-interval): a stream's first text goes out at
    # once, then its text every N tokens, and the rest at its end. 1 sends every token; more means
    # fewer responses through the stub, tritonserver and the frontend, at the price of a burstier
    # stream (docs/benchmarks.md measures both).
    stream_interval: int = 1
    # auto: hermes when the chat template writes <tool_call>, chatglm3 for model_type chatglm,
    # else none (requests with tools are then refused). See python_backend/text/output_formats.py.
    tool_call_parser: str = "auto"  # auto | hermes | chatglm3 | none
    # auto: think when the vocabulary or chat template has <think>; none: never split reasoning.
    reasoning_parser: str = "auto"  # auto | think | none
    # MindIE's LoraModules: a JSON object {"adapter name": "/local/peft/adapter/folder"}; a
    # request whose `model` is an adapter's name runs with that adapter (see lora.py).
    lora_modules: str = ""
    # Run Python code shipped inside the model folder (ChatGLM3 and other `auto_map` models need
    # it). Off by default: that code runs with the server's rights, so only for trusted folders.
    trust_remote_code: bool = False
    # On CPU, reorder float32/bfloat16 linear weights once into oneDNN's layout (cpu/linear.py):
    # about 2x faster linear layers. Off only to rule it out when chasing a numerical difference.
    cpu_prepack_weights: bool = True
    # On CPU, build the C decode-attention kernel for bfloat16 text models with the machine's C
    # compiler (native/attention_kernel.py), once, into ~/.cache/triton-chat/native.
    cpu_native_attention: bool = True
    # On CPU, pin the engine's compute threads one per physical core, and the Triton stub's other
    # threads to the first of them (native/thread_binding.py, as vLLM's VLLM_CPU_OMP_THREADS_BIND).
    # Off by default: on the 2-core test machine it made no difference beyond the noise
    # (docs/benchmarks.md), and two model instances on one host would pin to the same cores.
    cpu_bind_threads: bool = False
    # auto: the model's dtype, except that a 16-bit text model on CPU without the C kernel keeps
    # keys/values in float32 (PyTorch's decode attention 2-5x faster, twice the KV memory).
    kv_cache_dtype: str = "auto"  # auto | model

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise SettingsError(f"dtype must be one of {', '.join(DTYPES)}, got '{self.dtype}'")
        for name, choices in (
            ("kv_cache_dtype", KV_CACHE_DTYPE_CHOICES),
            ("tool_call_parser", TOOL_CALL_PARSER_CHOICES),
            ("reasoning_parser", REASONING_PARSER_CHOICES),
        ):
            if getattr(self, name) not in choices:
                raise SettingsError(f"{name} must be one of {', '.join(choices)}, got '{getattr(self, name)}'")
        device = self.device
        base = device.split(":", 1)[0]
        if base not in ("auto", "cpu", "cuda", "npu") or (":" in device and not device.split(":", 1)[1].isdigit()):
            raise SettingsError(f"device must be auto, cpu, cuda[:N] or npu[:N], got '{device}'")
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_iter_times", "stream_interval"):
            if getattr(self, name) < 1:
                raise SettingsError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in (
            "max_waiting_requests",
            "kv_cache_memory_mb",
            "prefix_cache_memory_mb",
            "max_seq_len",
            "max_input_token_len",
            "torch_threads",
        ):
            if getattr(self, name) < 0:
                raise SettingsError(f"{name} must be >= 0, got {getattr(self, name)}")

    @staticmethod
    def from_parameters(params: dict[str, str]) -> EngineSettings:
        """Build from Triton's ``{"key": "value"}`` parameters; unknown keys are an error."""
        known = {f.name: f for f in fields(EngineSettings)}
        values: dict[str, Any] = {}
        for key, text in params.items():
            if key not in known:
                raise SettingsError(f"unknown model parameter '{key}'")
            if known[key].type in ("bool", bool):
                if text.lower() not in ("true", "false", "1", "0"):
                    raise SettingsError(f"model parameter '{key}' must be true or false, got '{text}'")
                values[key] = text.lower() in ("true", "1")
            elif known[key].type in ("int", int):
                try:
                    values[key] = int(text)
                except ValueError as exc:
                    raise SettingsError(f"model parameter '{key}' must be an integer, got '{text}'") from exc
            else:
                values[key] = text
        return EngineSettings(**values)

    def to_parameters(self) -> dict[str, str]:
        def text(value: object) -> str:
            return str(value).lower() if isinstance(value, bool) else str(value)

        return {f.name: text(getattr(self, f.name)) for f in fields(self)}
