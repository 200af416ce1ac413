"""Engine settings: what the model reads from its ``config.pbtxt`` parameters.

Owns: ``EngineSettings`` (typed, validated, with documented defaults), its conversion from and
to Triton's string-valued config parameters, so the launcher writes exactly what the model reads,
and ``SettingInfo``, the description beside each field that the launcher's flags, the
``config.json`` mapping and the configuration docs are generated from. No torch here.
"""

from __future__ import annotations

from dataclasses import Field, dataclass, field, fields
from typing import Any

DTYPES = ("auto", "bfloat16", "float16", "float32")
# The tool-call formats the model can parse (python_backend.text.tool_parsers implements each).
HERMES = "hermes"
CHATGLM3 = "chatglm3"
LLAMA3_JSON = "llama3_json"
MISTRAL = "mistral"
TOOL_PARSERS = (HERMES, CHATGLM3, LLAMA3_JSON, MISTRAL)
TOOL_CALL_PARSER_CHOICES = ("auto", *TOOL_PARSERS, "none")
REASONING_PARSER_CHOICES = ("auto", "think", "none")
KV_CACHE_DTYPE_CHOICES = ("auto", "model", "bfloat16")
DEVICE_BASES = ("auto", "cpu", "cuda", "npu")

MODEL_GROUP = "model"
LIMITS_GROUP = "engine limits"
_INFO = "triton_chat"  # the key of a field's SettingInfo in its dataclasses metadata


class SettingsError(ValueError):
    """A bad engine setting; the message names the key."""


@dataclass(frozen=True)
class SettingInfo:
    """What users are told about one setting, and where else it can be given."""

    help: str  # one line: the flag's --help text
    flag: str | None = None  # the `triton-chat serve` flag; None: config.pbtxt only
    mindie_key: str | None = None  # its key in MindIE's config.json ModelConfig, where one exists
    choices: tuple[str, ...] = ()  # the valid values of a string setting; () = any (checked apart)
    minimum: int | None = None  # integers: the smallest valid value
    metavar: str | None = None  # the flag's value in --help
    group: str = MODEL_GROUP  # the --help section the flag is listed in
    docs: str = ""  # docs/configuration.md's meaning column; "" = the help text
    docs_default: str = ""  # the default as the docs say it; "" = the value itself


def _setting(default: Any, info: SettingInfo) -> Any:
    return field(default=default, metadata={_INFO: info})


def setting_info(spec: Field[Any]) -> SettingInfo:
    """The ``SettingInfo`` declared beside an ``EngineSettings`` field."""
    info = spec.metadata.get(_INFO)
    if not isinstance(info, SettingInfo):
        raise TypeError(f"EngineSettings.{spec.name} has no SettingInfo")
    return info


def setting_kind(spec: Field[Any]) -> str:
    """``"bool"``, ``"int"`` or ``"str"``: the type of an ``EngineSettings`` field."""
    # `from __future__ import annotations` keeps the annotations as strings.
    return spec.type if isinstance(spec.type, str) else spec.type.__name__


@dataclass(frozen=True)
class EngineSettings:
    """Engine configuration. Every field is a ``config.pbtxt`` parameter of the same name."""

    model_path: str = _setting(
        "",
        SettingInfo(
            "local Hugging Face model folder (default: the SmolLM2-135M-Instruct demo model)",
            flag="--model",
            mindie_key="modelWeightPath",
            metavar="DIR",
            docs="local Hugging Face folder",
            docs_default="the demo model",
        ),
    )
    served_model_name: str = _setting(
        "",
        SettingInfo(
            "the `model` name clients send (default: the folder's name)",
            flag="--served-model-name",
            mindie_key="modelName",
            metavar="NAME",
            docs="the `model` clients send; `/v1/models` lists it",
            docs_default="the folder's name",
        ),
    )
    dtype: str = _setting(
        "auto",
        SettingInfo(
            "weights dtype (default: auto = the folder's torch_dtype)",
            flag="--dtype",
            mindie_key="dtype",
            choices=DTYPES,
            docs="`auto` (the checkpoint's; on CPU a float16 checkpoint runs in bfloat16, and a 16-bit one in "
            "float32 where the CPU has no bfloat16 kernels, as on AVX2-only x86), `bfloat16`, `float16`, `float32`",
        ),
    )
    device: str = _setting(
        "auto",
        SettingInfo(
            "auto | cpu | cuda[:N] | npu[:N] (default: auto)",
            flag="--device",
            mindie_key="device",
            metavar="DEVICE",
            docs="`auto` (CUDA, else Ascend, else CPU), `cpu`, `cuda[:N]`, `npu[:N]`",
        ),
    )
    # One model over several devices: rank 0 is this process, the others are worker processes
    # it starts (python_backend.parallel); each holds a shard of the weights and of the KV cache.
    tensor_parallel_size: int = _setting(
        1,
        SettingInfo(
            "devices (ranks) one model instance is split over; 1 = no tensor parallel",
            flag="--tensor-parallel-size",
            mindie_key="worldSize",
            minimum=1,
            metavar="N",
            docs="ranks the model's layers are split over (tensor parallel: attention heads and MLP "
            "columns per rank, one process per rank, gloo on CPU, NCCL on CUDA, HCCL on Ascend); "
            "see [tensor parallel](tensor-parallel.md)",
        ),
    )
    device_ids: str = _setting(
        "",
        SettingInfo(
            "comma-separated device index of each rank, e.g. 0,1,2,3 (default: from --device's index up)",
            flag="--device-ids",
            mindie_key="npuDeviceIds",
            metavar="IDS",
            docs="CUDA/NPU index of each rank, comma-separated (`0,1,2,3`); in `config.json` also "
            "MindIE's list form (`[[0, 1, 2, 3]]`)",
            docs_default="the device's index, then the next ones",
        ),
    )
    max_num_seqs: int = _setting(
        64,
        SettingInfo(
            "sequences in the running batch at most",
            flag="--max-num-seqs",
            mindie_key="maxBatchSize",
            minimum=1,
            metavar="N",
            group=LIMITS_GROUP,
            docs="sequences in the running batch",
        ),
    )
    max_num_batched_tokens: int = _setting(
        512,
        SettingInfo(
            "prompt tokens prefilled per step",
            flag="--max-num-batched-tokens",
            mindie_key="maxPrefillTokens",
            minimum=1,
            metavar="N",
            group=LIMITS_GROUP,
            docs="prompt tokens prefilled per step (longer prompts are chunked)",
        ),
    )
    mixed_prefill: bool = _setting(
        True,
        SettingInfo(
            "prefill prompts in passes of their own before each decode step instead of inside it",
            flag="--no-mixed-prefill",
            group=LIMITS_GROUP,
            docs="CPU: a step's prompt tokens (up to `max_num_batched_tokens`) go through the same forward "
            "pass as the running batch's next tokens, as vLLM's chunked prefill mixes them, so decode rows "
            "do not wait behind a separate prefill pass; off with speculative decoding and `batch_invariant`",
        ),
    )
    max_waiting_requests: int = _setting(
        256,
        SettingInfo(
            "queued requests beyond which new ones are refused as overloaded",
            flag="--max-waiting-requests",
            mindie_key="maxQueueSize",
            minimum=0,
            metavar="N",
            group=LIMITS_GROUP,
            docs="waiting requests beyond which new ones get 429",
        ),
    )
    # xgrammar's compile time grows faster than the schema (seconds at tens of kilobytes of
    # enum) and cannot be interrupted: a ceiling keeps one request from holding the compiler.
    max_response_format_bytes: int = _setting(
        65536,
        SettingInfo(
            "largest response_format JSON schema (as compact JSON) that is compiled; larger ones get a 400",
            flag="--max-response-format-bytes",
            minimum=1,
            metavar="BYTES",
            group=LIMITS_GROUP,
            docs="largest `response_format` JSON schema, as compact JSON, that is compiled into a grammar; a "
            "larger one gets a 400 naming `response_format` at once",
        ),
    )
    grammar_compile_timeout_s: int = _setting(
        10,
        SettingInfo(
            "seconds a request waits for its response_format grammar to compile before it gets a 400",
            flag="--grammar-compile-timeout-s",
            minimum=1,
            metavar="S",
            group=LIMITS_GROUP,
            docs="seconds a request waits for its `response_format` grammar (compiled beside the engine, one "
            "at a time, cached by schema) before it gets a 400 naming `response_format`; other requests "
            "run meanwhile",
        ),
    )
    # Chat templates, tokenizing and media decoding take time that grows with the prompt: several
    # threads do it, so one multi-megabyte prompt does not hold up the short ones behind it.
    prepare_workers: int = _setting(
        2,
        SettingInfo(
            "threads that prepare requests (chat template, tokenizing, media); at most the CPUs available",
            flag="--prepare-workers",
            minimum=1,
            metavar="N",
            group=LIMITS_GROUP,
            docs="threads that prepare requests (chat template, tokenizing, media decoding) beside the "
            "engine, at most the CPUs the model may use; one slow prompt holds up only its own thread",
        ),
    )
    prepare_timeout_s: int = _setting(
        30,
        SettingInfo(
            "seconds a request may take to be prepared (chat template, tokenizing, media) before it gets an error",
            flag="--prepare-timeout-s",
            minimum=1,
            metavar="S",
            group=LIMITS_GROUP,
            docs="seconds from a request's arrival in the model to its prompt being ready (chat template, "
            "tokenizing, media decoding); later, it gets a 400 naming its prompt (or a 429 when it "
            "waited for a free preparer thread all that time), and what was still being prepared is "
            "dropped when it finishes",
        ),
    )
    kv_cache_memory_mb: int = _setting(
        0,
        SettingInfo(
            "KV-cache budget; 0 = automatic",
            flag="--kv-cache-memory-mb",
            mindie_key="kvCacheMemoryMb",
            minimum=0,
            metavar="MB",
            group=LIMITS_GROUP,
            docs="KV-cache budget (a share of free memory when automatic)",
            docs_default="`0` (automatic)",
        ),
    )
    # Keep the keys/values of recent prompts and reuse them for prompts that start the same way
    # (a shared system prompt, earlier turns of a chat).
    enable_prefix_caching: bool = _setting(
        True,
        SettingInfo(
            "recompute every prompt in full instead of reusing the keys/values of a cached prefix",
            flag="--no-enable-prefix-caching",
            group=LIMITS_GROUP,
            docs="reuse the keys/values of a cached prompt start (system prompt, earlier turns); "
            "`usage.prompt_tokens_details.cached_tokens` says how many prompt tokens were reused",
        ),
    )
    prefix_cache_memory_mb: int = _setting(
        0,
        SettingInfo(
            "memory for the keys/values of recent prompts, reused by prompts that start the same way; "
            "0 = automatic (an eighth of the KV-cache budget)",
            flag="--prefix-cache-memory-mb",
            minimum=0,
            metavar="MB",
            group=LIMITS_GROUP,
            docs="memory of the prefix cache (least recently used entries go first), taken from the KV "
            "budget; at most half of it",
            docs_default="`0` (an eighth of the KV budget)",
        ),
    )
    max_seq_len: int = _setting(
        0,
        SettingInfo(
            "prompt + output tokens at most; 0 = the model's context length",
            flag="--max-seq-len",
            mindie_key="maxSeqLen",
            minimum=0,
            metavar="N",
            group=LIMITS_GROUP,
            docs="prompt + output tokens",
            docs_default="`0` (the model's context)",
        ),
    )
    max_input_token_len: int = _setting(
        0,
        SettingInfo(
            "prompt tokens at most; 0 = max-seq-len - 1",
            flag="--max-input-token-len",
            mindie_key="maxInputTokenLen",
            minimum=0,
            metavar="N",
            group=LIMITS_GROUP,
            docs="prompt tokens; longer prompts get a 400 `context_length_exceeded`",
            docs_default="`0` (`maxSeqLen - 1`)",
        ),
    )
    max_iter_times: int = _setting(
        512,
        SettingInfo(
            "default and cap of max_tokens",
            flag="--max-iter-times",
            mindie_key="maxIterTimes",
            minimum=1,
            metavar="N",
            group=LIMITS_GROUP,
            docs="default and cap of `max_tokens`",
        ),
    )
    torch_threads: int = _setting(
        0,
        SettingInfo(
            "CPU intra-op threads; 0 = torch's default",
            flag="--torch-threads",
            minimum=0,
            metavar="N",
            group=LIMITS_GROUP,
            docs="intra-op threads of the engine thread (the only thread that runs torch in parallel)",
            docs_default="`0` (torch's choice)",
        ),
    )
    # More tokens per response means fewer responses through the stub, tritonserver and the
    # frontend, at the price of a burstier stream.
    stream_interval: int = _setting(
        1,
        SettingInfo(
            "tokens per streamed response after the first (as vLLM's); 1 = every token (default)",
            flag="--stream-interval",
            minimum=1,
            metavar="N",
            group=LIMITS_GROUP,
            docs="tokens per streamed response, as vLLM's `--stream-interval`: a stream's first text goes "
            "out at once, then its text every N tokens, and what is left with the finish reason. Fewer "
            "responses through the stub, `tritonserver` and the frontend (on 2 CPU cores at 16 streams, "
            "measurable throughput: [performance](performance.md)), at the price of a burstier stream; the "
            "answer, its logprobs and its per-token telemetry are the same",
        ),
    )
    # Prompt-lookup speculation: a row whose recent tokens occurred earlier in its own prompt or
    # output proposes what followed them; one forward pass verifies the proposals, so an answer
    # that copies its prompt takes several tokens per step. Off by default: on prompts that do
    # not repeat, the wider verify steps cost time and buy nothing.
    speculative_ngram_tokens: int = _setting(
        0,
        SettingInfo(
            "n-gram speculative decoding: draft tokens proposed per step from the row's own prompt and output; 0 = off",
            flag="--speculative-ngram-tokens",
            minimum=0,
            metavar="K",
            group=LIMITS_GROUP,
            docs="prompt-lookup speculative decoding (vLLM's `ngram` method): each step, a sequence whose "
            "last tokens occurred before in its prompt or output proposes up to K tokens that followed "
            "them, and the step verifies them; greedy answers are identical and sampled ones have the "
            "same distribution. See [design](design.md#speculative-decoding)",
            docs_default="`0` (off)",
        ),
    )
    speculative_ngram_min: int = _setting(
        2,
        SettingInfo(
            "shortest n-gram matched for a proposal (vLLM's prompt_lookup_min)",
            flag="--speculative-ngram-min",
            minimum=1,
            metavar="N",
            group=LIMITS_GROUP,
        ),
    )
    speculative_ngram_max: int = _setting(
        5,
        SettingInfo(
            "longest n-gram matched for a proposal (vLLM's prompt_lookup_max)",
            flag="--speculative-ngram-max",
            minimum=1,
            metavar="N",
            group=LIMITS_GROUP,
        ),
    )
    # Speculation pays at low concurrency and costs at high (docs/performance.md): above this
    # many running rows a step is a plain one, and prompts may ride in it again (mixed steps).
    speculative_disable_by_batch_size: int = _setting(
        0,
        SettingInfo(
            "speculative decoding: plain steps while more than N sequences run (vLLM's disable_by_batch_size); 0 = never",
            flag="--speculative-disable-by-batch-size",
            minimum=0,
            metavar="N",
            group=LIMITS_GROUP,
            docs="with `speculative_ngram_tokens` or `speculative_model`: a step whose running batch has more "
            "than N sequences verifies no drafts, and prompts then join it as in a step without speculation "
            "(`mixed_prefill`), so speculation speeds up the quiet hours and costs nothing under load; `0`: "
            "always speculate. See [performance](performance.md#speculative-decoding)",
            docs_default="`0` (never)",
        ),
    )
    # Draft-model speculation: a small model sharing the tokenizer proposes tokens greedily and
    # the step verifies them as it verifies n-gram drafts. It pays where the draft is much smaller
    # than the model and agrees with it often; the draft runs row by row, so it suits low concurrency.
    speculative_model: str = _setting(
        "",
        SettingInfo(
            "local folder of a small draft model for speculative decoding (same tokenizer); empty = none",
            flag="--speculative-model",
            metavar="DIR",
            group=LIMITS_GROUP,
            docs="draft-model speculative decoding (vLLM's `draft_model` method): each step, the draft "
            "model (a local folder whose tokenizer is the model's) proposes `speculative_model_tokens` "
            "tokens per sequence greedily and the step verifies them; greedy answers are identical and "
            "sampled ones have the same distribution. Not with `speculative_ngram_tokens` or tensor "
            "parallel. See [design](design.md#speculative-decoding)",
            docs_default="none",
        ),
    )
    speculative_model_tokens: int = _setting(
        4,
        SettingInfo(
            "draft tokens the speculative model proposes per sequence and step",
            flag="--speculative-model-tokens",
            minimum=1,
            metavar="K",
            group=LIMITS_GROUP,
        ),
    )
    # auto: from the chat template (<tool_call>: hermes, [TOOL_CALLS]: mistral, Llama 3's JSON
    # call instructions or <|python_tag|>: llama3_json), chatglm3 for model_type chatglm, else
    # none (requests with tools are then refused).
    tool_call_parser: str = _setting(
        "auto",
        SettingInfo(
            "tool-call format of the model's output (default: auto, from the chat template)",
            flag="--tool-call-parser",
            mindie_key="toolCallParser",
            choices=TOOL_CALL_PARSER_CHOICES,
            docs="`auto`, `hermes` (Qwen2.5), `chatglm3`, `llama3_json` (Llama 3.x), `mistral`, `none`",
        ),
    )
    # auto: think when the vocabulary or chat template has <think>; none: never split reasoning.
    reasoning_parser: str = _setting(
        "auto",
        SettingInfo(
            "split <think> reasoning into reasoning_content (default: auto)",
            flag="--reasoning-parser",
            mindie_key="reasoningParser",
            choices=REASONING_PARSER_CHOICES,
            docs="`auto`, `think`, `none`",
        ),
    )
    # MindIE's LoraModules: a JSON object {"adapter name": "/local/peft/adapter/folder"}; a
    # request whose `model` is an adapter's name runs with that adapter.
    lora_modules: str = _setting(
        "",
        SettingInfo(
            "a LoRA adapter (PEFT folder) requests select with model=NAME (repeatable)",
            flag="--lora-module",
            metavar="NAME=DIR",
            docs="a LoRA adapter (PEFT folder) requests select with `model=NAME`; in `config.json`: "
            "`LoraModules` (below)",
            docs_default="none",
        ),
    )
    # ChatGLM3 and other `auto_map` models need it. Off by default: that code runs with the
    # server's rights.
    trust_remote_code: bool = _setting(
        False,
        SettingInfo(
            "run Python code shipped in the model folder (needed by e.g. ChatGLM3); trusted folders only",
            flag="--trust-remote-code",
            mindie_key="trustRemoteCode",
            docs="run Python code shipped in the model folder (ChatGLM3 needs it); only for folders you trust",
        ),
    )
    cpu_prepack_weights: bool = _setting(
        True,
        SettingInfo(
            "on CPU, keep linear weights in PyTorch's layout instead of oneDNN's (about 2x slower)",
            flag="--no-cpu-prepack-weights",
            docs="CPU: reorder float32/bfloat16 linear weights once into oneDNN's blocked layout (about 2x "
            "faster linear layers)",
        ),
    )
    cpu_native_attention: bool = _setting(
        True,
        SettingInfo(
            "on CPU, do not build the C decode-attention and RMSNorm kernels for bfloat16 and float32 models "
            "(PyTorch's are slower)",
            flag="--no-cpu-native-attention",
            docs="CPU, bfloat16 and float32 text models: build the C decode-attention kernel with the machine's C "
            "compiler (once, into `<cache>/native/`) and use it, and for Llama/Qwen2 models the one-pass RMSNorm "
            "kernel (with the residual add before it); without a compiler the engine logs it and uses PyTorch's",
        ),
    )
    # Off by default: it made no difference beyond the noise on a 2-core machine, and two model
    # instances on one host would pin to the same cores.
    cpu_bind_threads: bool = _setting(
        False,
        SettingInfo(
            "on CPU, pin the engine's compute threads one per physical core (the stub's other threads to the first)",
            flag="--cpu-bind-threads",
            docs="CPU: pin the engine's compute threads one per physical core of the CPUs the process may "
            "use (as vLLM's `VLLM_CPU_OMP_THREADS_BIND`), and the Triton stub's other threads to the first "
            "of them. Off by default: no difference beyond the noise on the 2-core test machine "
            "(at 16 streams, 334-377 tok/s over 8 pinned runs against 316-363 over 5 unpinned), and two model instances on one host would pin to the same "
            "cores. Skipped with fewer cores than threads or without a C compiler",
        ),
    )
    # On by default: alone it keeps the full team (a probe costs a few steps every few seconds),
    # and beside a busy process it is what keeps the engine from running at the pace of a
    # preempted thread.
    cpu_adaptive_threads: bool = _setting(
        True,
        SettingInfo(
            "on CPU, keep the engine's compute thread count fixed instead of following the CPU available",
            flag="--no-cpu-adaptive-threads",
            docs="CPU: every few seconds under load, time decode steps with one compute thread fewer (or "
            "more, up to `torch_threads`) and keep the faster count, so that a busy process on one of the "
            "cores costs that core, not the whole team's pace; the count in use is the "
            "`triton_chat_compute_threads` gauge",
        ),
    )
    # On by default: fewer page faults and less system time under load (docs/performance.md),
    # and an idle server still gives its memory back.
    cpu_keep_freed_memory: bool = _setting(
        True,
        SettingInfo(
            "on CPU, let glibc return freed memory to the system at once (its defaults)",
            flag="--no-cpu-keep-freed-memory",
            docs="CPU: have glibc's allocator in the model's process serve blocks up to 32 MiB from its heap and "
            "keep freed memory while requests run, so that the buffers a step allocates again and again do "
            "not fault in fresh pages each time; what it kept goes back to the system when the engine goes "
            "idle. Nothing changes where the environment already sets `MALLOC_*_` variables or `glibc.malloc` "
            "tunables",
        ),
    )
    # auto keeps float32 keys/values for a 16-bit text model on CPU without the C kernel:
    # PyTorch's decode attention is 2-5x faster that way, for twice the KV memory. bfloat16 halves
    # a float32 model's KV bytes, which decode attention reads from DRAM every step.
    kv_cache_dtype: str = _setting(
        "auto",
        SettingInfo(
            "auto: the model's dtype, or float32 for a 16-bit model on CPU without the C kernel; model: its "
            "dtype; bfloat16: CPU, keys/values of a float32 model stored in bfloat16",
            flag="--kv-cache-dtype",
            choices=KV_CACHE_DTYPE_CHOICES,
            docs="`auto`: the model's dtype, except that a 16-bit text model on CPU without the C attention "
            "kernel keeps float32 keys/values (faster PyTorch attention, twice the memory); `model`: always "
            "the model's dtype; `bfloat16` (text models on CPU): a float32 model's keys and values are "
            "rounded to bfloat16 when they are stored, prompts and prefix cache included, and attention reads "
            "them widened back: half the KV memory and half the bytes each decode step reads, for outputs "
            "that differ from `auto`'s within bfloat16 rounding",
        ),
    )
    # Off by default: it costs throughput (docs/performance.md) that most deployments would rather have.
    batch_invariant: bool = _setting(
        False,
        SettingInfo(
            "CPU: greedy output that does not depend on the batch, the prefix cache or chunking (slower)",
            flag="--batch-invariant",
            docs="CPU, float32/bfloat16 text models: every matrix product runs a fixed number of rows at a "
            "time and one attention kernel serves prefill and decode with a fixed order of additions, so a "
            "request's logits are bit-identical alone, in any batch, cold or from the prefix cache, chunked "
            "or not (greedy output repeats exactly); costs throughput, see [performance](performance.md). "
            "Needs a C compiler",
        ),
    )

    def __post_init__(self) -> None:
        for spec in fields(self):
            info, value = setting_info(spec), getattr(self, spec.name)
            if info.choices and value not in info.choices:
                raise SettingsError(f"{spec.name} must be one of {', '.join(info.choices)}, got '{value}'")
            if info.minimum is not None and value < info.minimum:
                raise SettingsError(f"{spec.name} must be >= {info.minimum}, got {value}")
        device = self.device
        base = device.split(":", 1)[0]
        if base not in DEVICE_BASES or (":" in device and not device.split(":", 1)[1].isdigit()):
            raise SettingsError(f"device must be auto, cpu, cuda[:N] or npu[:N], got '{device}'")

        if self.speculative_ngram_min > self.speculative_ngram_max:
            raise SettingsError(
                f"speculative_ngram_min ({self.speculative_ngram_min}) must be <= speculative_ngram_max "
                f"({self.speculative_ngram_max})"
            )
        if self.speculative_model and self.speculative_ngram_tokens > 0:
            raise SettingsError("speculative_model and speculative_ngram_tokens: choose one way to draft tokens")
        if self.kv_cache_dtype == "bfloat16" and self.batch_invariant:
            raise SettingsError(
                "kv_cache_dtype bfloat16 does not run with batch_invariant (its kernel reads the model's dtype)"
            )
        if self.speculative_model and self.tensor_parallel_size > 1:
            raise SettingsError("speculative_model does not run with tensor_parallel_size > 1")
        if self.device_ids:
            ids = self.device_ids.split(",")
            if not all(i.strip().isdigit() for i in ids):
                raise SettingsError(f"device_ids must be comma-separated device indexes, got '{self.device_ids}'")
            if len(ids) != self.tensor_parallel_size:
                raise SettingsError(
                    f"device_ids names {len(ids)} devices; tensor_parallel_size is {self.tensor_parallel_size}"
                )

    @property
    def rank_device_ids(self) -> list[int]:
        """The device index of each rank, as ``device_ids`` names them; [] when it names none."""
        return [int(i) for i in self.device_ids.split(",")] if self.device_ids else []

    @staticmethod
    def from_parameters(params: dict[str, str]) -> EngineSettings:
        """Build from Triton's ``{"key": "value"}`` parameters; unknown keys are an error."""
        known = {f.name: f for f in fields(EngineSettings)}
        values: dict[str, Any] = {}
        for key, text in params.items():
            if key not in known:
                raise SettingsError(f"unknown model parameter '{key}'")
            kind = setting_kind(known[key])
            if kind == "bool":
                if text.lower() not in ("true", "false", "1", "0"):
                    raise SettingsError(f"model parameter '{key}' must be true or false, got '{text}'")
                values[key] = text.lower() in ("true", "1")
            elif kind == "int":
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
