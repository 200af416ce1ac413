"""The engine's limits: batch and token budgets, queues, caches, lengths, threads and streaming."""

from __future__ import annotations

from dataclasses import dataclass

from python_backend.protocol.settings.info import LIMITS_GROUP, SettingInfo, setting


@dataclass(frozen=True)
class LimitSettings:
    """Batch and token budgets, queues, caches, lengths, threads and streaming."""

    max_num_seqs: int = setting(
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
    max_num_batched_tokens: int = setting(
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
    mixed_prefill: bool = setting(
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
    max_waiting_requests: int = setting(
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
    max_response_format_bytes: int = setting(
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
    grammar_compile_timeout_s: int = setting(
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
    prepare_workers: int = setting(
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
    prepare_timeout_s: int = setting(
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
    kv_cache_memory_mb: int = setting(
        0,
        SettingInfo(
            "KV-cache budget; 0 = automatic",
            flag="--kv-cache-memory-mb",
            mindie_key="kvCacheMemoryMb",
            bytes_flag="--kv-cache-memory-bytes",
            minimum=0,
            metavar="MB",
            group=LIMITS_GROUP,
            docs="KV-cache budget (a share of free memory when automatic)",
            docs_default="`0` (automatic)",
        ),
    )
    # Keep the keys/values of recent prompts and reuse them for prompts that start the same way
    # (a shared system prompt, earlier turns of a chat).
    enable_prefix_caching: bool = setting(
        True,
        SettingInfo(
            "reuse the keys/values of a cached prompt prefix; --no-enable-prefix-caching recomputes every "
            "prompt in full",
            flag="--enable-prefix-caching",
            group=LIMITS_GROUP,
            docs="reuse the keys/values of a cached prompt start (system prompt, earlier turns); "
            "`usage.prompt_tokens_details.cached_tokens` says how many prompt tokens were reused",
        ),
    )
    prefix_cache_memory_mb: int = setting(
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
    max_seq_len: int = setting(
        0,
        SettingInfo(
            "prompt + output tokens at most; 0 = the model's context length",
            flag="--max-model-len",
            aliases=("--max-seq-len",),
            mindie_key="maxSeqLen",
            minimum=0,
            metavar="N",
            group=LIMITS_GROUP,
            docs="prompt + output tokens",
            docs_default="`0` (the model's context)",
        ),
    )
    max_input_token_len: int = setting(
        0,
        SettingInfo(
            "prompt tokens at most; 0 = --max-model-len - 1",
            flag="--max-input-token-len",
            mindie_key="maxInputTokenLen",
            minimum=0,
            metavar="N",
            group=LIMITS_GROUP,
            docs="prompt tokens; longer prompts get a 400 `context_length_exceeded`",
            docs_default="`0` (`maxSeqLen - 1`)",
        ),
    )
    max_iter_times: int = setting(
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
    max_logprobs: int = setting(
        20,
        SettingInfo(
            "most top tokens a request may ask for in top_logprobs, logprobs or prompt_logprobs",
            flag="--max-logprobs",
            minimum=0,
            metavar="N",
            group=LIMITS_GROUP,
            docs="as vLLM's `--max-logprobs`: the most alternatives a request may ask for in `top_logprobs` "
            "(chat), `logprobs` (completions) or `prompt_logprobs`; more is a 400 naming the field and "
            "the ceiling, from the frontend and from the model alike",
        ),
    )
    torch_threads: int = setting(
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
    stream_interval: int = setting(
        1,
        SettingInfo(
            "tokens per streamed response after the first (as vLLM's); 1 = every token",
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
