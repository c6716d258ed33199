"""From `--model FAMILY:NAME` to a client: the family's dialect (models/dialects/: its key
variable, its default endpoint, its wire) driven by the one HTTP client (models/http.py), or a
scripted replay. Apart from base.py so that loading the shared types loads no client; only this
module, above both, turns a spec into one."""

from __future__ import annotations

from ..errors import ErrorType, OpenAgentsError
from .base import DEFAULT_MODEL_TIMEOUT_S, ModelClient, RetryPolicy, api_key
from .dialects import DIALECTS, MODEL_FORMS, SCRIPT
from .http import HttpModelClient
from .script import ScriptedModel

_KINDS = ", ".join(DIALECTS) + f" or {SCRIPT}"


def key_variable(spec: str, api_key_env: str | None = None) -> str | None:
    """The variable the model's key comes from, so the transcript can redact its value."""
    dialect = DIALECTS.get(spec.partition(":")[0])
    return api_key_env or (dialect.key_variable if dialect else None)


def model_from_spec(
    spec: str,
    base_url: str | None = None,
    api_key_env: str | None = None,
    retry: RetryPolicy | None = None,
    timeout_s: float = DEFAULT_MODEL_TIMEOUT_S,
) -> ModelClient:
    """One of MODEL_FORMS (`openai:NAME`, `script:FILE`, ...). `timeout_s`: --model-timeout."""
    kind, sep, name = spec.partition(":")
    if not sep or not name:
        raise OpenAgentsError(ErrorType.CONFIG_INVALID, f"--model {spec!r}: use {MODEL_FORMS}")
    if kind == SCRIPT:
        return ScriptedModel.load(name)
    dialect = DIALECTS.get(kind)
    if dialect is None:
        raise OpenAgentsError(ErrorType.CONFIG_INVALID, f"unknown model kind {kind!r}: use {_KINDS}")
    url = base_url or dialect.default_url()
    return HttpModelClient(
        dialect, name, url, api_key(api_key_env or dialect.key_variable, url), retry or RetryPolicy(), timeout_s
    )
