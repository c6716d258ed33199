"""From `--model FAMILY:NAME` to a client: one row per model family (its key variable, its default
endpoint, its client). Apart from base.py so that the clients depend on the shared layer and the
shared layer on none of them; only this module, above both, knows every family."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

from ..errors import ErrorType, OpenAgentsError
from .anthropic import AnthropicClient
from .base import DEFAULT_MODEL_TIMEOUT_S, ModelClient, RetryPolicy, api_key
from .gemini import GeminiClient
from .openai import OpenAIChatClient
from .script import ScriptedModel


@dataclass(frozen=True)
class Family:
    """A model family served over HTTP: the variable its key comes from (unless --api-key-env names
    another), its endpoint when --base-url gives none, and its client."""

    key_variable: str
    default_url: Callable[[], str]  # read when a client is made: OPENAI_BASE_URL may be set late
    client: Callable[[str, str, str, RetryPolicy, float], ModelClient]  # (name, url, key, retry, timeout_s)


FAMILIES: dict[str, Family] = {
    "openai": Family("OPENAI_API_KEY", lambda: os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1", OpenAIChatClient),
    "gemini": Family("GEMINI_API_KEY", lambda: "https://generativelanguage.googleapis.com/v1beta", GeminiClient),
    "anthropic": Family("ANTHROPIC_API_KEY", lambda: os.environ.get("ANTHROPIC_BASE_URL") or "https://api.anthropic.com", AnthropicClient),
}
SCRIPT = "script"  # `script:FILE`: a recorded conversation replayed, no endpoint and no key (tests, demos)
_KINDS = ", ".join(FAMILIES) + f" or {SCRIPT}"
_FORMS = ", ".join(f"{kind}:NAME" for kind in FAMILIES) + f" or {SCRIPT}:FILE"


def key_variable(spec: str, api_key_env: str | None = None) -> str | None:
    """The variable the model's key comes from, so the transcript can redact its value."""
    family = FAMILIES.get(spec.partition(":")[0])
    return api_key_env or (family.key_variable if family else None)


def model_from_spec(spec: str, base_url: str | None = None, api_key_env: str | None = None, retry: RetryPolicy | None = None,
                    timeout_s: float = DEFAULT_MODEL_TIMEOUT_S) -> ModelClient:
    """`openai:NAME`, `gemini:NAME`, `anthropic:NAME` or `script:FILE`. `timeout_s`: --model-timeout."""
    kind, sep, name = spec.partition(":")
    if not sep or not name:
        raise OpenAgentsError(ErrorType.CONFIG_INVALID, f"--model {spec!r}: use {_FORMS}")
    if kind == SCRIPT:
        return ScriptedModel.load(name)
    family = FAMILIES.get(kind)
    if family is None:
        raise OpenAgentsError(ErrorType.CONFIG_INVALID, f"unknown model kind {kind!r}: use {_KINDS}")
    url = base_url or family.default_url()
    return family.client(name, url, api_key(api_key_env or family.key_variable, url), retry or RetryPolicy(), timeout_s)
