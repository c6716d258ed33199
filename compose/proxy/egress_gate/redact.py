"""Blanking a secret in what the box's client will read, in the forms an echoing server may write it.

An upstream that echoes a request (a debugging endpoint, an error page quoting a header) may write
the injected secret as it is, in another case, percent-encoded (`%67hp_...`, any hex case, only some
bytes), as JSON `\\u0067` or `\\/` escapes (mixed with plain characters, as serializers do), as hex
(either case), or inside base64 (standard or URL-safe alphabet, padded or not, at any of the three
byte alignments a longer encoded text may put it at). One pattern per secret matches all of them
and each match becomes asterisks. The stream is matched with an overlap window as long as the
longest encoded form, so a match across two reads is found (Redactor.feed), and what is held back
is bounded by that window.
"""

from __future__ import annotations

import base64
import functools
import re

MIN_SECRET = 4  # shorter values would blank ordinary text
_JSON_SHORT = {0x2F: "/", 0x22: '"', 0x5C: "\\"}  # JSON's two-character escapes a serializer may use


def _hex_pair(byte: int) -> str:
    """Two hex digits of `byte`, either case each."""
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else c for c in f"{byte:02x}")


def _char_forms(byte: int) -> list[str]:
    """One byte of the secret as the echo may write it, each form's pattern starting with one
    literal character: itself (either case), %XX, \\u00XX, a JSON short escape, `+` for a space."""
    char = chr(byte)
    plain = [char.lower(), char.upper()] if char.isalpha() and byte < 0x80 else [char]
    forms = [re.escape(c) for c in dict.fromkeys(plain)] + ["%" + _hex_pair(byte), r"\\[uU]00" + _hex_pair(byte)]
    if byte in _JSON_SHORT:
        forms.append(re.escape("\\" + _JSON_SHORT[byte]))
    if byte == 0x20:
        forms.append(r"\+")  # a form-encoded space
    return forms


def _base64_cores(secret: bytes) -> list[bytes]:
    """The base64 characters that depend on the secret's bytes only, at each alignment (0, 1 or 2
    bytes before it in the encoded text), in both alphabets: a substring of any base64 text that
    holds the secret, padded or not."""
    cores = []
    for before in range(3):
        text = base64.b64encode(b"\0" * before + secret)
        first = -(-8 * before // 6)  # the first character made only of the secret's bits
        last = 8 * (before + len(secret)) // 6  # past the last such character
        core = text[first:last]
        cores += [core, core.translate(bytes.maketrans(b"+/", b"-_"))]
    return cores


def secret_branches(secret: bytes) -> tuple[list[str], int]:
    """The patterns of every form of `secret`, each starting with one literal character (so the
    regex engine skips ahead to the bytes a form can start with), and the longest text they match."""
    rest = "".join("(?:" + "|".join(_char_forms(b)) + ")" for b in secret[1:])
    branches = [form + rest for form in _char_forms(secret[0])]
    digits = secret.hex()
    hex_rest = "".join(f"[{d}{d.upper()}]" if d.isalpha() else d for d in digits[1:])
    branches += [lead + hex_rest for lead in dict.fromkeys([digits[0], digits[0].upper()])]
    cores = sorted(set(_base64_cores(secret)), key=len, reverse=True)
    branches += [re.escape(c.decode("ascii")) for c in cores if len(c) >= MIN_SECRET]
    return branches, 6 * len(secret)


@functools.lru_cache(maxsize=64)
def _compiled(secrets: tuple[bytes, ...]) -> tuple[re.Pattern[bytes] | None, int]:
    """The one pattern of all the secrets' forms and the overlap window, made once per set of
    secrets (about 80 ms for a token and its header value), not once per request."""
    patterns = [secret_branches(s) for s in secrets]
    pattern = (
        re.compile("|".join(b for branches, _ in patterns for b in branches).encode("latin-1")) if patterns else None
    )
    return pattern, max((n for _, n in patterns), default=1) - 1


class Redactor:
    """Blanks each secret, in each of its forms, in a byte stream read in pieces. feed() returns what
    may go on; the last `window` bytes wait for the next piece (or final=True), so a form split
    across reads is still found. With no secrets it passes everything through at once."""

    def __init__(self, secrets: list[bytes]) -> None:
        self.secrets = tuple(sorted({s for s in secrets if len(s) >= MIN_SECRET}, key=len, reverse=True))
        self.pattern, self.window = _compiled(self.secrets)
        self.tail = b""

    def blank(self, data: bytes) -> bytes:
        """Every form of every secret in `data` (a whole text) as asterisks."""
        if self.pattern is None:
            return data
        return self.pattern.sub(lambda m: b"*" * len(m.group()), data)

    def feed(self, data: bytes, final: bool = False) -> bytes:
        if self.pattern is None:
            return data
        buf = self.blank(self.tail + data)
        if final:
            self.tail = b""
            return buf
        cut = max(0, len(buf) - self.window)
        out, self.tail = buf[:cut], buf[cut:]
        return out
