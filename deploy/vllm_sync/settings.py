"""`arloop serve vllm-sync`'s settings (apart from deploy/settings.py: no model is loaded here)."""

from __future__ import annotations

from pydantic import Field, SecretStr

from deploy.settings import CommonSettings


class VllmSyncSettings(CommonSettings):
    """`arloop serve vllm-sync`: keeps a running vLLM serving the registry's LoRA versions."""

    vllm_url: str = "http://127.0.0.1:8000"
    """The vLLM server (`vllm serve <base> --enable-lora`, started with
    VLLM_ALLOW_RUNTIME_LORA_UPDATING=True); its OpenAI API is under /v1."""
    vllm_api_key: SecretStr | None = None
    """vLLM's `--api-key`, sent as a bearer token (unset: none)."""
    vllm_route_name: str = Field("arloop", pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    """The name agents call: ARLOOP_POLICY_MODEL=hosted_vllm/<this> routes `champion` and
    `candidate` to the adapters this process loaded (one name per vLLM)."""
    vllm_base_name: str | None = None
    """The base model's name in vLLM (`--served-model-name`), which serves the base version
    v0; unset: the one model vLLM lists that is not an adapter."""
    vllm_path_map: dict[str, str] = Field(default_factory=dict)
    """Checkpoint folders as vLLM sees them, by prefix: `{"/data": "/mnt/arloop"}` when
    vLLM mounts the learner's volume elsewhere (unset: the same paths)."""
    vllm_poll_s: float = Field(5.0, gt=0.0)
    """Registry and vLLM check interval, besides the registry's pub/sub notices."""
    vllm_drain_s: float = Field(120.0, ge=0.0)
    """How long an adapter no alias uses stays loaded before it is unloaded, so requests
    already sent to it finish (keep it above the agents' ARLOOP_POLICY_TIMEOUT_S)."""
    vllm_timeout_s: float = Field(120.0, gt=0.0)
    """Seconds one call to vLLM may take (loading an adapter reads it from disk)."""
