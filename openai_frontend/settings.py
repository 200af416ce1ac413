"""Frontend settings: everything the HTTP frontend is configured with.

Owns: ``FrontendSettings``, a frozen, validated pydantic model built by the launcher (or a test)
and handed to ``create_app``, and ``flag_info``: the launcher flag and MindIE ``ServerConfig`` key
declared beside a field, from which the launcher's HTTP flags, the ``config.json`` mapping and the
configuration docs are generated (each field's ``description`` is its help text). Nothing here
reads the environment or files: configuration sources are the launcher's job, so importing this
module has no side effects.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from openai_frontend.media.policy import MediaSettings
from python_backend.protocol.params import MAX_TOP_LOGPROBS

MINDIE_MODE = "vllm"  # MindIE's ``openAiSupport`` value that selects its own (vLLM-like) formats
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024  # Triton's default; one 40 MB base64 image fits
DEFAULT_TIMEOUT_S = 600.0  # MindIE's default tokenTimeout and e2eTimeout
OPENAI_MODES = (MINDIE_MODE, "openai")  # the launcher's --openai-mode choices
DEFAULT_MAX_HEADER_BYTES = 32 * 1024  # nginx's large_client_header_buffers in all; long JWTs fit
DEFAULT_MAX_HEADERS = 100  # Apache's LimitRequestFields
DEFAULT_HEADER_TIMEOUT_S = 20.0  # Apache's mod_reqtimeout header default
DEFAULT_BODY_TIMEOUT_S = 120.0  # a 64 MiB body at about 0.5 MB/s
DEFAULT_MAX_CONNECTIONS = 1024  # each holds a file descriptor and buffers; streams are long-lived


@dataclass(frozen=True)
class FlagInfo:
    """Where a ``FrontendSettings`` field can be given besides ``create_app``'s caller."""

    flag: str  # the launcher flag; --no-X for a setting that is on by default
    dest: str  # the flag's argparse dest (the launcher's option name)
    mindie_key: str | None = None  # its key in MindIE's config.json ServerConfig
    choices: tuple[str, ...] = ()
    metavar: str | None = None
    docs: str = ""  # docs/configuration.md's meaning column; "" = the description


def flag_info(name: str) -> FlagInfo | None:
    """The ``FlagInfo`` declared beside a ``FrontendSettings`` field, if it has a flag."""
    # pydantic keeps Annotated metadata it does not know in the field's metadata list.
    found = [item for item in FrontendSettings.model_fields[name].metadata if isinstance(item, FlagInfo)]
    return found[0] if found else None


# The docs table says more than --help has room for.
_OPENAI_MODE_DOCS = "`vllm` (or absent): MindIE's formats; anything else: plain OpenAI behaviour"
_FULL_TEXT_DOCS = "streamed `delta.content` is the cumulative text; the last chunk adds `full_text`"
_API_KEYS_DOCS = (
    "accepted `Authorization: Bearer` keys; none given: the `TRITON_CHAT_API_KEY` environment variable, which "
    "other local users cannot read as they can a command line; empty: no authentication"
)
_TOKEN_TIMEOUT_DOCS = (
    "seconds a stream may wait for its next response from the model, its first included (queue wait and "
    "prefill count): past it a stream that has not started gets a 504, one that has gets an error event "
    "(MindIE's `err_msg` or OpenAI's `error`, code `token_timeout`) and `[DONE]`, and the request is "
    "cancelled in Triton. Time spent writing to a slow client does not count. Non-streaming answers arrive "
    "whole, so only `e2eTimeout` bounds them"
)
_E2E_TIMEOUT_DOCS = (
    "seconds a request may take in all (the gRPC call's deadline): past it a 504 (code `timeout`), or the "
    "error event in a stream, and the request is cancelled in Triton"
)
_RESPONSE_CHANNEL_DOCS = (
    "turn off the response channel: each streamed delta of each request becomes its own gRPC response "
    "instead of one channel response per engine step for all streaming requests (docs/design.md, "
    '"Response channels")'
)


@dataclass(frozen=True)
class HttpLimits:
    """The HTTP layer's limits (``openai_frontend.http.limits``); names as in ``FrontendSettings``."""

    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    max_headers: int = DEFAULT_MAX_HEADERS
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS


_HEADER_TIMEOUT_DOCS = (
    "seconds a connection may take to send a request's line and headers, from its opening or its previous "
    "response's end: past it a 408 (code `request_timeout`) and the connection closes"
)
_BODY_TIMEOUT_DOCS = (
    "seconds a request may take to send its whole body once the server reads it: past it a 408 (code "
    "`request_timeout`) and the connection closes"
)
_MAX_CONNECTIONS_DOCS = (
    "open connections the frontend accepts requests on; a request on one more gets a 503 (code "
    "`too_many_connections`, with `Retry-After`) and its connection closes"
)
_ALLOWED_ORIGINS_DOCS = (
    "origins (`https://app.example.com`, or `*`) whose browser pages may call the API (CORS); "
    "none: no CORS headers, and a preflight is answered like any request without a key or a route"
)
_SSE_KEEPALIVE_DOCS = (
    "seconds between `: keep-alive` comment lines of a stream that waits for its first token; the stream's "
    "headers are then sent at once, so an error before the first token arrives as the stream's error event, "
    "not as an HTTP status. 0: off (headers with the first token)"
)
LOG_FORMATS = ("text", "json")
DEFAULT_CORS_METHODS = ("GET", "POST")
DEFAULT_CORS_HEADERS = ("Authorization", "Content-Type", "X-Request-Id")


class FrontendSettings(BaseModel):
    """Configuration of one frontend process."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    triton_grpc_url: str = Field(default="127.0.0.1:8001", description="host:port of Triton's gRPC endpoint")
    triton_model_name: str = Field(default="triton_chat", description="the Triton model that serves chat requests")
    served_model_name: str = Field(..., min_length=1, description="the `model` name clients send")
    lora_names: list[str] = Field(default_factory=list, description="LoRA adapter names clients may send as `model`")
    max_logprobs: int = Field(
        default=MAX_TOP_LOGPROBS,
        ge=0,
        description="the model's max_logprobs (--max-logprobs): the most alternatives a request may ask for in "
        "top_logprobs, logprobs or prompt_logprobs",
    )
    openai_mode: Annotated[
        str, FlagInfo("--openai-mode", "openai_mode", "openAiSupport", OPENAI_MODES, docs=_OPENAI_MODE_DOCS)
    ] = Field(
        default=MINDIE_MODE,
        description="vllm: MindIE's response formats (default); openai: plain OpenAI behaviour",
    )
    full_text_enabled: Annotated[
        bool, FlagInfo("--full-text", "full_text", "fullTextEnabled", docs=_FULL_TEXT_DOCS)
    ] = Field(default=False, description="MindIE fullTextEnabled: stream the cumulative text too")
    strict_params: Annotated[bool, FlagInfo("--strict-params", "strict_params", "strictParams")] = Field(
        default=False, description="reject unknown request fields with 400 instead of naming them in `x-ignored-params`"
    )
    api_keys: Annotated[list[str], FlagInfo("--api-key", "api_keys", "apiKeys", metavar="KEY", docs=_API_KEYS_DOCS)] = (
        Field(default_factory=list, description="accepted Bearer key (repeatable); none = no authentication")
    )
    token_timeout_s: Annotated[
        float, FlagInfo("--token-timeout", "token_timeout", "tokenTimeout", metavar="S", docs=_TOKEN_TIMEOUT_DOCS)
    ] = Field(
        default=DEFAULT_TIMEOUT_S,
        gt=0,
        description="MindIE tokenTimeout: a stream whose next response (its first included) takes longer than S "
        "seconds ends with a timeout error and is cancelled",
    )
    request_timeout_s: Annotated[
        float, FlagInfo("--e2e-timeout", "e2e_timeout", "e2eTimeout", metavar="S", docs=_E2E_TIMEOUT_DOCS)
    ] = Field(
        default=DEFAULT_TIMEOUT_S,
        gt=0,
        description="MindIE e2eTimeout: a request not finished after S seconds ends with a timeout error (504, or "
        "an error event in a stream) and is cancelled",
    )
    response_channel: Annotated[
        bool, FlagInfo("--no-response-channel", "response_channel", docs=_RESPONSE_CHANNEL_DOCS)
    ] = Field(
        default=True,
        description="the response channel: one gRPC response per engine step for the streamed deltas of all "
        "streaming requests, instead of one per delta",
    )
    backend_probe_interval_s: float = Field(
        default=1.0,
        gt=0,
        description="seconds between checks that tritonserver answers (gRPC ServerLive, which must answer "
        "within as long); while one fails, requests get a 503 `backend_unavailable` at once",
    )
    allowed_origins: Annotated[
        list[str], FlagInfo("--allowed-origins", "allowed_origins", metavar="ORIGIN", docs=_ALLOWED_ORIGINS_DOCS)
    ] = Field(default_factory=list, description="an origin browsers may call the API from (CORS)")
    allowed_methods: Annotated[list[str], FlagInfo("--allowed-methods", "allowed_methods", metavar="METHOD")] = Field(
        default_factory=list,
        description="a method CORS allows; none: " + ", ".join(DEFAULT_CORS_METHODS),
    )
    allowed_headers: Annotated[list[str], FlagInfo("--allowed-headers", "allowed_headers", metavar="HEADER")] = Field(
        default_factory=list,
        description="a request header CORS allows; none: " + ", ".join(DEFAULT_CORS_HEADERS),
    )
    allow_credentials: Annotated[bool, FlagInfo("--allow-credentials", "allow_credentials")] = Field(
        default=False, description="let CORS requests carry credentials (not with the origin `*`)"
    )
    sse_keepalive_s: Annotated[
        float, FlagInfo("--sse-keepalive", "sse_keepalive", metavar="S", docs=_SSE_KEEPALIVE_DOCS)
    ] = Field(
        default=0.0,
        ge=0,
        description="send a `: keep-alive` comment every S seconds while a stream waits for its first token, "
        "and the stream's headers at once (0: off)",
    )
    log_format: Annotated[str, FlagInfo("--log-format", "log_format", choices=LOG_FORMATS)] = Field(
        default="text", description="text: plain log lines; json: one JSON object per line (frontend and launcher)"
    )
    metrics_vllm_names: Annotated[bool, FlagInfo("--metrics-vllm-names", "metrics_vllm_names")] = Field(
        default=False,
        description="name the /metrics families as vLLM does (`vllm:` prefix), so its Grafana dashboards work as they are",
    )
    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY_BYTES, gt=0, description="largest accepted request body")
    max_header_bytes: Annotated[int, FlagInfo("--max-header-bytes", "max_header_bytes", metavar="N")] = Field(
        default=DEFAULT_MAX_HEADER_BYTES,
        gt=0,
        description="largest request line and headers in bytes; more is a 431",
    )
    max_headers: Annotated[int, FlagInfo("--max-headers", "max_headers", metavar="N")] = Field(
        default=DEFAULT_MAX_HEADERS, gt=0, description="most header fields in one request; more is a 431"
    )
    header_timeout_s: Annotated[
        float, FlagInfo("--header-timeout", "header_timeout", metavar="S", docs=_HEADER_TIMEOUT_DOCS)
    ] = Field(
        default=DEFAULT_HEADER_TIMEOUT_S,
        gt=0,
        description="seconds a connection may take to send a request's headers; then a 408 and the close",
    )
    body_timeout_s: Annotated[
        float, FlagInfo("--body-timeout", "body_timeout", metavar="S", docs=_BODY_TIMEOUT_DOCS)
    ] = Field(
        default=DEFAULT_BODY_TIMEOUT_S,
        gt=0,
        description="seconds a request may take to send its whole body; then a 408 and the close",
    )
    max_connections: Annotated[
        int, FlagInfo("--max-connections", "max_connections", metavar="N", docs=_MAX_CONNECTIONS_DOCS)
    ] = Field(
        default=DEFAULT_MAX_CONNECTIONS,
        gt=0,
        description="open connections served at most; a request on one more gets a 503",
    )
    media: MediaSettings = Field(
        default_factory=MediaSettings,
        description="media fetching policy; the default refuses remote media (see docs/media-security.md)",
    )

    @field_validator("lora_names", "api_keys")
    @classmethod
    def _no_empty_items(cls, value: list[str]) -> list[str]:
        if any(not item for item in value):
            raise ValueError("must not contain empty strings")
        return value

    @field_validator("allowed_origins", "allowed_methods", "allowed_headers")
    @classmethod
    def _no_blank_items(cls, value: list[str]) -> list[str]:
        if any(not item.strip() for item in value):
            raise ValueError("must not contain empty strings")
        return value

    @field_validator("log_format")
    @classmethod
    def _known_log_format(cls, value: str) -> str:
        if value not in LOG_FORMATS:
            raise ValueError(f"must be one of {', '.join(LOG_FORMATS)}")
        return value

    @model_validator(mode="after")
    def _credentials_need_named_origins(self) -> FrontendSettings:
        # Browsers refuse credentials with a wildcard origin; allowing both would echo any origin.
        if self.allow_credentials and "*" in self.allowed_origins:
            raise ValueError("allow_credentials needs named origins, not '*'")
        return self

    @model_validator(mode="after")
    def _lora_names_distinct(self) -> FrontendSettings:
        if self.served_model_name in self.lora_names:
            raise ValueError("lora_names must not repeat served_model_name")
        if len(set(self.lora_names)) != len(self.lora_names):
            raise ValueError("lora_names must be distinct")
        return self

    @property
    def http_limits(self) -> HttpLimits:
        """The limits the HTTP layer enforces (each an ``HttpLimits`` field of the same name)."""
        return HttpLimits(**{spec.name: getattr(self, spec.name) for spec in fields(HttpLimits)})

    @property
    def mindie_mode(self) -> bool:
        """True for MindIE's formats (``openai_mode == "vllm"``), False for plain OpenAI behaviour."""
        return self.openai_mode == MINDIE_MODE

    @property
    def model_names(self) -> tuple[str, ...]:
        """Every name a request may use as ``model``: the base model first, then the adapters."""
        return (self.served_model_name, *self.lora_names)

    @property
    def cors_methods(self) -> tuple[str, ...]:
        """The methods CORS allows: the configured ones, else the API's own."""
        return tuple(method.upper() for method in self.allowed_methods) or DEFAULT_CORS_METHODS

    @property
    def cors_headers(self) -> tuple[str, ...]:
        """The request headers CORS allows: the configured ones, else those the API reads."""
        return tuple(self.allowed_headers) or DEFAULT_CORS_HEADERS
