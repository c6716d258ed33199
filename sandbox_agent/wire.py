"""The agent's protocol JSON on the C accelerator the json package itself runs on, without importing
the package: `import json` compiles its regular expressions (and imports `re`, `enum` ...) and that
cost every box's start 11 ms under runc and 23 ms under gVisor (issue 26, measured in a box).

`decode` is json.loads and `encode` is json.dumps(ensure_ascii=False, separators=(",", ":")) whenever
they succeed: the same C scanner and encoder with the settings json's defaults give them. Anything the
fast path does not accept (a syntax error, a BOM, trailing data) goes to json.loads, which then raises
its own error, with its own message; an interpreter without `_json` uses the json package throughout.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: importing typing costs the agent's start 10-25 ms
if TYPE_CHECKING:
    from typing import Any, Callable

_WHITESPACE = " \t\n\r"  # json.decoder.WHITESPACE
_CONSTANTS = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}


class _DecoderSettings:
    """What the C scanner reads from a json.JSONDecoder() made with no arguments."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = _CONSTANTS.__getitem__


def _not_serializable(o: object) -> object:
    raise TypeError(
        f"Object of type {o.__class__.__name__} is not JSON serializable"
    )  # json.JSONEncoder.default's words


def _json_loads(text: str) -> Any:
    import json

    return json.loads(text)


def _json_dumps(obj: object) -> str:
    import json

    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


try:
    from _json import encode_basestring, make_encoder, make_scanner

    _scan: Callable[[str, int], tuple[Any, int]] | None = make_scanner(_DecoderSettings())  # type: ignore[arg-type]  # typeshed names the class itself, the C code reads attributes

    def _encoder() -> Callable[[object, int], Any]:
        """A fresh encoder per message, as json.dumps makes one: its circular-reference markers are
        left holding what a failed encode had entered (and would call that object circular next time)."""
        return make_encoder({}, _not_serializable, encode_basestring, None, ":", ",", False, False, True)

    _encoder()  # the signature this module knows, or the json package
    _new_encoder: Callable[[], Callable[[object, int], Any]] | None = _encoder
except (ImportError, TypeError):  # no accelerator, or one whose signature changed: the json package
    _scan = _new_encoder = None


def decode(text: str) -> Any:
    """json.loads(text)."""
    if _scan is None or text.startswith("\ufeff"):
        return _json_loads(text)
    start = len(text) - len(text.lstrip(_WHITESPACE))
    try:
        value, end = _scan(text, start)
    except (StopIteration, ValueError):  # json.loads says what is wrong, in its words
        return _json_loads(text)
    if text[end:].strip(_WHITESPACE):
        return _json_loads(text)
    return value


def json_len(text: str) -> int:
    """len(json.dumps(text, ensure_ascii=False)): the characters a string costs in a message."""
    if _new_encoder is None:
        return len(_json_dumps(text))
    return len(encode_basestring(text))


def encode(obj: object) -> str:
    """json.dumps(obj, ensure_ascii=False, separators=(",", ":"))."""
    if _new_encoder is None or isinstance(obj, str):
        return _json_dumps(obj)
    return "".join(_new_encoder()(obj, 0))
