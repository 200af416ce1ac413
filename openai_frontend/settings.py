"""Frontend settings: everything the HTTP frontend is configured with.

Owns: ``FrontendSettings``, a frozen, validated pydantic model built by the launcher (or a test)
and handed to ``create_app``. Nothing here reads the environment or files: configuration sources
are the launcher's job, so importing this module has no side effects.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from openai_frontend.media.policy import MediaSettings

MINDIE_MODE = "vllm"  # MindIE's ``openAiSupport`` value that selects its own (vLLM-like) formats
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024  # Triton's default; one 40 MB base64 image fits
DEFAULT_TIMEOUT_S = 600.0  # MindIE's default tokenTimeout and e2eTimeout


class FrontendSettings(BaseModel):
    """Configuration of one frontend process."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    triton_grpc_url: str = Field(default="127.0.0.1:8001", description="host:port of Triton's gRPC endpoint")
    triton_model_name: str = Field(default="triton_chat", description="the Triton model that serves chat requests")
    served_model_name: str = Field(..., min_length=1, description="the `model` name clients send")
    lora_names: list[str] = Field(default_factory=list, description="LoRA adapter names clients may send as `model`")
    openai_mode: str = Field(
        default=MINDIE_MODE,
        description='MindIE `openAiSupport`: "vllm" = MindIE formats (default); any other value = plain OpenAI',
    )
    full_text_enabled: bool = Field(default=False, description="MindIE `fullTextEnabled`: stream cumulative text")
    strict_params: bool = Field(
        default=False, description="reject unknown request fields with 400 instead of naming them in `x-ignored-params`"
    )
    api_keys: list[str] = Field(default_factory=list, description="accepted Bearer keys; empty = no auth")
    request_timeout_s: float = Field(
        default=DEFAULT_TIMEOUT_S, gt=0, description="MindIE `e2eTimeout`: end-to-end deadline of one request"
    )
    token_timeout_s: float = Field(
        default=DEFAULT_TIMEOUT_S,
        gt=0,
        description="MindIE `tokenTimeout`: longest wait for a stream's next response (its first included)",
    )
    response_channel: bool = Field(
        default=True,
        description="streamed deltas over one channel per frontend, one gRPC response per engine step",
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
