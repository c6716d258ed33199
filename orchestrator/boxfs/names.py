"""Names of box-written entries: bytes inside, one escaping function for people, a lossless
text form for stores.

A name is whatever bytes the box chose: a newline (which would split a line of output or a
line-based store), a tab, an escape sequence, invalid UTF-8 (which `str.encode` refuses, so a
store that encodes names breaks on the first one). Inside the host a name is `bytes`, or the
`os.fsdecode` form of it (lone surrogates for undecodable bytes: it round-trips exactly).
"""
from __future__ import annotations

import os

from ..terminal.render import visible


def _as_bytes(name: bytes | str) -> bytes:
    return name if isinstance(name, bytes) else os.fsencode(name)


def show(name: bytes | str) -> str:
    """The one way a box-written name is shown: on one line, every control, format or invalid
    byte made visible (`\\n`, `\\t`, `\\x1b`, `\\xff`), so it can neither break a line of output
    nor steer a terminal. Not reversible: for display only."""
    text = _as_bytes(name).decode("utf-8", "backslashreplace")
    return visible(text).replace("\n", "\\n").replace("\t", "\\t")


def to_store(name: bytes | str) -> str:
    """A lossless, valid-UTF-8 text form of a name for JSON stores and indexes: each undecodable
    byte as `\\xNN` and a backslash doubled, so every name has exactly one form."""
    raw = _as_bytes(name)
    if b"\\" not in raw:
        try:
            return raw.decode("utf-8")  # the common case: valid UTF-8 is its own form
        except UnicodeDecodeError:
            pass
    out: list[str] = []
    for char in raw.decode("utf-8", "surrogateescape"):
        code = ord(char)
        if 0xDC80 <= code <= 0xDCFF:
            out.append(f"\\x{code - 0xDC00:02x}")
        elif char == "\\":
            out.append("\\\\")
        else:
            out.append(char)
    return "".join(out)


def from_store(text: str) -> bytes:
    """The bytes of a name kept by `to_store`."""
    out = bytearray()
    i = 0
    while i < len(text):
        char = text[i]
        if char == "\\" and text.startswith("\\\\", i):
            out += b"\\"
            i += 2
        elif char == "\\" and text.startswith("\\x", i) and len(text) >= i + 4:
            out.append(int(text[i + 2:i + 4], 16))
            i += 4
        else:
            out += char.encode("utf-8")
            i += 1
    return bytes(out)
