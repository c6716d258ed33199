"""Names of box-written entries: bytes inside, one escaping function for people, a lossless
text form for stores.

A name is whatever bytes the box chose: a newline (which would split a line of output or a
line-based store), a tab, an escape sequence, invalid UTF-8 (which `str.encode` refuses, so a
store that encodes names breaks on the first one). Inside the host a name is `bytes`, or the
`os.fsdecode` form of it (lone surrogates for undecodable bytes: it round-trips exactly).

Three forms leave the host, one per reader:
- `show`: a person's (one line, escaped, not reversible);
- `exact`: a machine's (JSON output): the name itself as a string when its bytes are valid UTF-8,
  else `{"bytes_b64": "<standard base64 of the bytes>"}`; `from_exact` gives the bytes back;
- `git_quoted`: git's, in a patch header: C-style quoted as git's quote.c does when the name holds
  `"`, `\\`, a control character or a byte >= 0x80, so `git apply` lands the very name.
"""

from __future__ import annotations

import base64
import os
import re
from typing import Any

from ..ground.text import one_line


def _as_bytes(name: bytes | str) -> bytes:
    return name if isinstance(name, bytes) else os.fsencode(name)


def show(name: bytes | str) -> str:
    """The one way a box-written name is shown: on one line, every control, format or invalid
    byte made visible (`\\n`, `\\t`, `\\x1b`, `\\xff`), so it can neither break a line of output
    nor steer a terminal. Not reversible: for display only."""
    return one_line(_as_bytes(name).decode("utf-8", "backslashreplace"))


Exact = str | dict[str, str]  # a name in machine output: see exact()


def exact(name: bytes | str) -> Exact:
    """The one lossless form of a name in JSON: the UTF-8 text itself when the bytes are valid
    UTF-8 (Python's strict codec: no encoded surrogate either), else {"bytes_b64": base64}."""
    raw = _as_bytes(name)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return {"bytes_b64": base64.b64encode(raw).decode("ascii")}


def from_exact(value: Any) -> bytes:
    """The bytes of a name given in exact() form; ValueError for anything else."""
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, dict) and set(value) == {"bytes_b64"} and isinstance(value["bytes_b64"], str):
        return base64.b64decode(value["bytes_b64"], validate=True)
    raise ValueError("not a name in exact form (a string, or an object with bytes_b64 alone)")


def stored_exact(path: str) -> Exact:
    """exact() of a name kept in to_store form."""
    return exact(from_store(path))


def stored_shown(path: str) -> str:
    """show() of a name kept in to_store form."""
    return show(from_store(path))


_GIT_ESCAPES = {0x07: "a", 0x08: "b", 0x09: "t", 0x0A: "n", 0x0B: "v", 0x0C: "f", 0x0D: "r", 0x22: '"', 0x5C: "\\"}


def git_quoted(name: bytes | str) -> str:
    """`name` as git writes a path in a patch (quote.c's quote_c_style, core.quotePath on): as it is
    when every byte is printable ASCII other than `"` and `\\`; else in double quotes, with `"`,
    `\\` and \\a \\b \\t \\n \\v \\f \\r escaped by letter and every other control byte and
    byte >= 0x80 as three octal digits. ASCII either way."""
    raw = _as_bytes(name)
    if all(0x20 <= b < 0x7F and b not in (0x22, 0x5C) for b in raw):
        return raw.decode("ascii")
    out = ['"']
    for b in raw:
        if b in _GIT_ESCAPES:
            out.append("\\" + _GIT_ESCAPES[b])
        elif b < 0x20 or b >= 0x7F:
            out.append(f"\\{b:03o}")
        else:
            out.append(chr(b))
    out.append('"')
    return "".join(out)


_TO_STORE = re.compile("[\\\\\udc80-\udcff]")  # a backslash, or an undecodable byte as surrogateescape gives it
_FROM_STORE = re.compile(r"\\(\\|x[0-9a-fA-F]{2})")


def to_store(name: bytes | str) -> str:
    """A lossless, valid-UTF-8 text form of a name for JSON stores and indexes: each undecodable
    byte as `\\xNN` and a backslash doubled, so every name has exactly one form."""
    raw = _as_bytes(name)
    if b"\\" not in raw:
        try:
            return raw.decode("utf-8")  # the common case: valid UTF-8 is its own form
        except UnicodeDecodeError:
            pass
    text = raw.decode("utf-8", "surrogateescape")
    return _TO_STORE.sub(lambda m: "\\\\" if m.group() == "\\" else f"\\x{ord(m.group()) - 0xDC00:02x}", text)


def from_store(text: str) -> bytes:
    """The bytes of a name kept by `to_store`."""
    if "\\" not in text:
        return text.encode("utf-8")
    out = bytearray()
    at = 0
    for m in _FROM_STORE.finditer(text):
        out += text[at : m.start()].encode("utf-8")
        out += b"\\" if m.group(1) == "\\" else bytes((int(m.group(1)[1:], 16),))
        at = m.end()
    out += text[at:].encode("utf-8")
    return bytes(out)
