"""Showing untrusted text to a person: every string from the box or the model goes through here.

A terminal obeys the bytes it is sent: ESC and CSI sequences clear the screen, hide text, move
the cursor or write the clipboard (OSC 52); a lone CR overwrites the line, so a fake prompt can
sit right above a real approval prompt; bidi overrides and zero-width characters make text read
differently from what it is. `visible()` keeps newlines and tabs and turns every other control
character, format character, line/paragraph separator and lone surrogate into printable escapes
(`\\x1b`, `\\u202e`), so what a person reads is what was sent.

`json_line()` does the same for the JSONL transcript: JSON escapes C0 itself, but DEL, C1, bidi
and format characters would otherwise be written raw (and a lone surrogate cannot be encoded at
all), so a `cat` of the transcript would reach the terminal raw.
"""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any

# Candidates only (everything outside printable ASCII but \n and \t); the category decides.
_CANDIDATE = re.compile(r"[^\x20-\x7e\n\t]")
_HIDDEN_CATEGORIES = frozenset(
    {"Cc", "Cf", "Cs", "Zl", "Zp"}
)  # controls, format (bidi, zero-width), surrogates, separators


def _hidden(char: str) -> bool:
    return unicodedata.category(char) in _HIDDEN_CATEGORIES


def _escape(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def visible(text: object) -> str:
    """`text` with every character that a terminal would act on or hide made printable.

    CRLF becomes LF (ordinary Windows line ends); a lone CR is shown as `\\x0d`. The result holds
    no character in C0 (but \\n, \\t), DEL, C1, Unicode's format or separator categories, or a
    surrogate, so visible(visible(x)) == visible(x).
    """
    text = text if isinstance(text, str) else str(text)
    text = text.replace("\r\n", "\n")
    return _CANDIDATE.sub(lambda m: _escape(m.group()) if _hidden(m.group()) else m.group(), text)


def json_line(value: Any) -> str:
    """Compact-enough JSON, UTF-8 readable, with every hidden character as a `\\uXXXX` escape.

    JSON's structure is ASCII, so such characters can only sit inside strings, where `\\uXXXX`
    decodes back to the same character: json.loads(json_line(v)) == v.
    """
    raw = json.dumps(value, ensure_ascii=False)
    return _CANDIDATE.sub(lambda m: _json_escape(m.group()) if _hidden(m.group()) else m.group(), raw)


def _json_escape(char: str) -> str:
    code = ord(char)
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000  # astral format characters (tags, U+E0001...) as a surrogate pair
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def one_line(text: object) -> str:
    """visible(text) on one line: newline and tab escaped too (`\\n`, `\\t`). The one form of a
    name (or any box-chosen string) inside a line of ours: it can neither start a line at the left
    margin nor steer the terminal. Not reversible: for display only."""
    return visible(text).replace("\n", "\\n").replace("\t", "\\t")


def continued(text: object, prefix: str = "    │ ") -> str:
    """visible(text), with every line after the first behind `prefix`: a newline the box or the
    model wrote can never start a line at the left margin, where our own prompts start."""
    return visible(text).replace("\n", "\n" + prefix)
