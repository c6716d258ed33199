"""Names of workspace entries as the tools give them and take them back, exactly (issue 49).

A name is whatever bytes the box chose: a newline, a tab, bytes that are not UTF-8. Inside the agent
(and the host) it is an `os.fsdecode` string: lone surrogates U+DC80..U+DCFF stand for the bytes
that are not UTF-8, so it round-trips to the very bytes. What leaves the agent is valid UTF-8 JSON:

- `exact`: the lossless form, for a result's structured listing (list_files' `names`, grep_files'
  `hits`): the name's text when it is valid UTF-8 and no longer as JSON than its base64 (a name of
  control characters would be six times longer), else {"bytes_b64": the standard base64 of its bytes};
- `from_arg`: a path argument in either form (a string, or that object) back to the name, so every
  name a listing gives can be read, listed or searched by the next call;
- `displayed`: for text a person or a model reads (a listing's lines, notes, messages): each byte
  that is not UTF-8 as `\\xNN`. Not reversible: the structured form is.

Standard library only: copied into the sandbox image and imported by the host, so the forms exist once."""

from __future__ import annotations

import binascii

from . import wire

TYPE_CHECKING = False  # not typing's: importing typing costs the agent's start 10-25 ms
if TYPE_CHECKING:
    from typing import Any

BYTES_KEY = "bytes_b64"


def _bytes(name: str) -> bytes:
    try:
        return name.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate no file name decodes to: kept as its own encoding
        return name.encode("utf-8", "surrogatepass")


def exact(name: str) -> str | dict[str, str]:
    """The lossless JSON form of a name (see the module's words)."""
    if name.isascii() and name.isprintable() and '"' not in name and "\\" not in name:
        return name  # the common name: its own JSON text, nothing to weigh
    try:
        raw = name.encode("utf-8")
    except UnicodeEncodeError:
        raw = None
    if raw is not None and wire.json_len(name) - 2 <= 4 * ((len(raw) + 2) // 3):
        return name
    return {BYTES_KEY: binascii.b2a_base64(_bytes(name), newline=False).decode("ascii")}


def from_arg(value: Any) -> str:
    """A name given as a string or as {"bytes_b64": ...}, as an os.fsdecode string; ValueError else."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and len(value) == 1 and isinstance(value.get(BYTES_KEY), str):
        try:
            raw = binascii.a2b_base64(value[BYTES_KEY].encode("ascii"), strict_mode=True)
        except (binascii.Error, UnicodeEncodeError, ValueError):
            raise ValueError("bytes_b64 must be standard base64") from None
        return raw.decode("utf-8", "surrogateescape")
    raise ValueError('must be a string, or {"bytes_b64": "<base64 of the name\'s bytes>"} for a name that is not UTF-8')


def displayed(text: str, backslash: str = "\\") -> str:
    """`text` with every lone surrogate shown as an escape (`\\xNN` for a byte that is not UTF-8):
    valid UTF-8, on the wire and on a screen. `backslash`: how the escape's backslash is written
    (`\\\\` inside JSON text, where the string then reads `\\xNN`)."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    return "".join(_escaped(ch, backslash) if "\ud800" <= ch <= "\udfff" else ch for ch in text)


def _escaped(ch: str, backslash: str) -> str:
    code = ord(ch)
    return f"{backslash}x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"{backslash}u{code:04x}"
