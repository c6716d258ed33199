"""JSON from the other side, with its nesting counted before the parser sees it.

`json.loads` recurses once per level, so a line of fifty thousand "[" takes the parser to the
interpreter's recursion limit. Catching the RecursionError afterwards is not enough: while the
parse is that deep, whatever else runs on the thread (a garbage-collection finaliser, a warning, a
signal handler) has no stack left and fails in its turn, somewhere unrelated. CI saw exactly that: an
unraisable RecursionError in the middle of a test that fed the host a deeply nested argument.
Counting the levels first, in passes that do not recurse, means no parse of hostile input ever gets
deep. The agent and the host share this module, so it keeps to the standard library."""

from __future__ import annotations

import json
import re
from typing import Any

MAX_DEPTH = 64  # levels of [ and {; the deepest message either side really sends has about eight

# A JSON string, or the unterminated rest of one; brackets inside strings are not structure.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
# Every opener becomes "(", every closer ")", everything else goes.
_OPEN_CLOSE = bytes.maketrans(b"[{]}", b"(())")
_NOT_BRACKET = bytes(set(range(256)) - set(b"[{]}"))


class TooDeep(ValueError):
    """Nested deeper than allowed; a ValueError, as any other JSON that will not parse."""


def deeper_than(data: bytes, max_depth: int) -> bool:
    """Whether [ and { outside strings nest deeper than `max_depth` (erring towards yes on text
    that is not JSON). Each round strips the innermost pairs, so it takes as many rounds as there
    are levels, and it stops after max_depth + 1: C-speed passes, no recursion, bounded work."""
    if data.count(b"[") + data.count(b"{") <= max_depth:
        return False
    brackets = _STRING.sub(b"", data).translate(_OPEN_CLOSE, _NOT_BRACKET)
    for rounds in range(max_depth + 1):
        stripped = brackets.replace(b"()", b"")
        if len(stripped) == len(brackets):  # what is left never closes: each opener is a level entered
            return rounds + brackets.count(b"(") > max_depth
        brackets = stripped
    return True


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
    return json.loads(text)
