"""One file per model family: its wire format, its tool declarations, its answers whole and
streamed, its errors and usage (dialect.py says what a family must define). The registry below is
data, the one place that lists the families (`--model openai:`, `gemini:`, `anthropic:`,
`openai-responses:`; a family's file is its name with `_` for `-`). Adding a family is one file and
one entry here: the one HTTP client (models/http.py), the `--model FAMILY:NAME` factory and the
tool declarations follow from it."""

from __future__ import annotations

from . import anthropic, gemini, openai, openai_responses
from .dialect import Assembler, Dialect

DIALECTS: dict[str, Dialect] = {
    d.family: d for d in (openai.DIALECT, gemini.DIALECT, anthropic.DIALECT, openai_responses.DIALECT)
}
SCRIPT = "script"  # `script:FILE`: a recorded conversation replayed, no endpoint and no key (tests, demos)
# every spelling --model takes, from the registry (the CLI's help texts and errors say the same)
MODEL_FORMS = ", ".join(f"{kind}:NAME" for kind in DIALECTS) + f" or {SCRIPT}:FILE"


def dialect(family: str) -> Dialect:
    found = DIALECTS.get(family)
    if found is None:
        raise ValueError(f"unknown model family {family!r}")
    return found


__all__ = ["DIALECTS", "Assembler", "Dialect", "dialect"]
