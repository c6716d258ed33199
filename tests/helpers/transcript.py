"""What tests/unit/test_transcript.py shares with other tests, kept here
(issue 48: helpers in one place, none imported from a test module)."""

from __future__ import annotations

# -- every event bounded, nothing raw ------------------------------------------------------------
HOSTILE = (
    "a\x1b[2J\x1b]52;c;aGk=\x07\x1b[8mhidden\x1b[0m\x7f\x9b31m\u202egnp.exe\u2066\u200b\ufeff\r? fake prompt\r\nnext"
)


def _raw_hidden(text: str) -> list[str]:
    """Every character a terminal would act on or hide (C0 but \\n and \\t, DEL, C1, format, separators, surrogates)."""
    import unicodedata

    return [c for c in text if c not in "\n\t" and unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp")]
