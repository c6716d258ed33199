"""JSON from the other side, with its nesting counted before the parser sees it.

`json.loads` recurses once per level, so a line of fifty thousand "[" takes the parser to the
interpreter's recursion limit. Catching the RecursionError afterwards is not enough: while the
parse is that deep, whatever else runs on the thread (a garbage-collection finaliser, a warning, a
signal handler) has no stack left and fails in its turn, somewhere unrelated. CI saw exactly that: an
unraisable RecursionError in the middle of a test that fed the host a deeply nested argument.
Counting the levels first, in passes that do not recurse, means no parse of hostile input ever gets
deep. The agent and the host share this module, so it keeps to the standard library."""

from __future__ import annotations

import itertools

from . import wire

TYPE_CHECKING = False  # not typing's: importing typing costs the agent's start 10-25 ms
if TYPE_CHECKING:
    from typing import Any

MAX_DEPTH = 64  # levels of [ and {; the deepest message either side really sends has about eight

# What is left of a line once strings are known: quotes and brackets. Then "[" and "{" step +1,
# "]" and "}" step -1 (0xff as a signed byte).
_NOT_STRUCTURE = bytes(set(range(256)) - set(b'"[]{}'))
_STEP = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
_PIECE = 64 * 1024


class TooDeep(ValueError):
    """Nested deeper than allowed; a ValueError, as any other JSON that will not parse."""


def deeper_than(data: bytes, max_depth: int) -> bool:
    """Whether [ and { outside strings nest deeper than `max_depth`, erring towards yes on text that
    is not JSON (the parser stops at the first error, and up to there the count follows it).

    Bytes-wide C passes and a running sum, a 64 KiB piece at a time: no regular expression (one that
    strips strings kept state per match, 785 MB for a 12 MiB line of empty strings), no object per
    string, nothing per level."""
    if data.count(b"[") + data.count(b"{") <= max_depth:
        return False
    # In a string a backslash escapes the next character: with escaped backslashes gone, then escaped
    # quotes, each quote left opens or closes a string; what lies between is inside.
    skeleton = data.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_STRUCTURE)
    depth, in_string = 0, False
    for start in range(0, len(skeleton), _PIECE):
        parts = skeleton[start : start + _PIECE].split(b'"')
        outside = b"".join(parts[1 if in_string else 0 :: 2])
        in_string ^= len(parts) % 2 == 0  # an odd number of quotes in this piece
        if outside:
            running = list(itertools.accumulate(memoryview(outside.translate(_STEP)).cast("b"), initial=depth))
            if max(running) > max_depth:
                return True
            depth = running[-1]
    return False


def loads(data: str | bytes, max_depth: int = MAX_DEPTH) -> Any:
    """json.loads, refusing nesting deeper than `max_depth` before parsing anything."""
    # Quotes, backslashes and brackets are ASCII and never part of a multi-byte UTF-8 sequence, so
    # the UTF-8 bytes have the same structure as the text. Bytes must be UTF-8 (UnicodeDecodeError is
    # a ValueError): json.loads would guess UTF-16 or -32 from NULs, where a quote or bracket byte can
    # be half of another character and the count would not see what the parser sees.
    if isinstance(data, str):
        text, raw = data, data.encode("utf-8", "surrogatepass")
    else:
        raw = bytes(data)
        text = raw.decode("utf-8", "surrogatepass")  # as json.loads decodes UTF-8 bytes
    if deeper_than(raw, max_depth):
        raise TooDeep(f"nested more than {max_depth} levels deep")
    return wire.decode(text)  # json.loads, without importing the json package (wire.py)
