"""Frontend settings: everything the HTTP frontend is configured with.

Owns: ``FrontendSettings``, a frozen, validated pydantic model built by the launcher (or a test)
and handed to ``create_app``, and ``flag_info``: the launcher flag and MindIE ``ServerConfig`` key
declared beside a field, from which the launcher's HTTP flags, the ``config.json`` mapping and the
configuration docs are generated (each field's ``description`` is its help text). Nothing here
reads the environment or files: configuration sources are the launcher's job, so importing this
module has no side effects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from openai_frontend.media.policy import MediaSettings

MINDIE_MODE = "vllm"  # MindIE's ``openAiSupport`` value that selects its own (vLLM-like) formats
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024  # Triton's default; one 40 MB base64 image fits
DEFAULT_TIMEOUT_S = 600.0  # MindIE's default tokenTimeout and e2eTimeout
OPENAI_MODES = (MINDIE_MODE, "openai")  # the launcher's --openai-mode choices


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
_API_KEYS_DOCS = "accepted `Authorization: Bearer` keys; empty: no authentication"
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


class FrontendSettings(BaseModel):
    """Configuration of one frontend process."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    triton_grpc_url: str = Field(default="127.0.0.1:8001", description="host:port of Triton's gRPC endpoint")
    triton_model_name: str = Field(default="triton_chat", description="the Triton model that serves chat requests")
    triton_headers: dict[str, str] = Field(
        default_factory=dict,
        repr=False,  # the launcher's per-start secret: never in a log line
        description="headers sent with every call to Triton (the launcher's restricted-API secret)",
    )
    served_model_name: str = Field(..., min_length=1, description="the `model` name clients send")
    lora_names: list[str] = Field(default_factory=list, description="LoRA adapter names clients may send as `model`")
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
    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY_BYTES, gt=0, description="largest accepted request body")
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

    @model_validator(mode="after")
    def _lora_names_distinct(self) -> FrontendSettings:
        if self.served_model_name in self.lora_names:
            raise ValueError("lora_names must not repeat served_model_name")
        if len(set(self.lora_names)) != len(self.lora_names):
            raise ValueError("lora_names must be distinct")
        return self

    @property
    def mindie_mode(self) -> bool:
        """True for MindIE's formats (``openai_mode == "vllm"``), False for plain OpenAI behaviour."""
        return self.openai_mode == MINDIE_MODE

    @property
    def model_names(self) -> tuple[str, ...]:
        """Every name a request may use as ``model``: the base model first, then the adapters."""
        return (self.served_model_name, *self.lora_names)
