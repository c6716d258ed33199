"""Telling text from binary and naming an encoding from a file's first bytes: read_file, grep_files
and write_file all judge a file the same way."""

from __future__ import annotations

BOM = b"\xef\xbb\xbf"


SNIFF_BYTES = 8192
_WIDE_BOMS = (  # longest first: the UTF-32 LE mark starts with the UTF-16 LE one
    (b"\xff\xfe\x00\x00", "utf-32-le", "UTF-32 LE"),
    (b"\x00\x00\xfe\xff", "utf-32-be", "UTF-32 BE"),
    (b"\xff\xfe", "utf-16-le", "UTF-16 LE"),
    (b"\xfe\xff", "utf-16-be", "UTF-16 BE"),
)
_BINARY_MAGIC = (
    b"\x89PNG\r\n\x1a\n",
    b"\xff\xd8\xff",
    b"GIF87a",
    b"GIF89a",
    b"%PDF-",
    b"PK\x03\x04",
    b"\x7fELF",
    b"\x1f\x8b",
    b"BZh",
    b"\xfd7zXZ\x00",
)
_TEXT_CONTROLS = frozenset(b"\t\n\r\f\b\x1b")


def _wide_encoding(head: bytes, whole: bool = False) -> tuple[str, str, int] | None:
    """(codec, label, mark length) of a UTF-16/32 byte-order mark, which is a hint, not a verdict: it
    counts only when what follows decodes strictly (`b"\\xff\\xfe\\nplain\\n"` is not UTF-16, and
    is judged by the ordinary text/binary rules). `head` is the file's first bytes; unless `whole`
    (they are all of it), a character cut at their end is not held against them."""
    for bom, codec, label in _WIDE_BOMS:  # the longest mark that matches is the only one considered
        if head.startswith(bom):
            return (codec, label, len(bom)) if decodes(head[len(bom) :], codec, whole) else None
    return None


def decodes(body: bytes, codec: str, final: bool = True) -> bool:
    """Whether `body` is strictly `codec`; with `final` false, an incomplete last character is not an error."""
    import codecs  # already loaded by the interpreter's start: this costs nothing

    try:
        codecs.getincrementaldecoder(codec)("strict").decode(body, final)
    except UnicodeDecodeError:
        return False
    return True


def cut_at_end(err: UnicodeDecodeError, size: int) -> bool:
    """The decoding failed only because the last character is incomplete (an odd trailing byte)."""
    return err.end >= size and err.reason in ("truncated data", "unexpected end of data")


def _looks_binary(head: bytes) -> bool:
    """As git and Gemini CLI (its isbinaryfile) judge it: a NUL byte, a known binary format's magic, or
    more than 10% suspicious bytes: control bytes, or bytes that are not part of valid UTF-8 unless
    the text reads as a single-byte encoding (windows-1251, Latin-1). A few stray Latin-1 bytes stay
    text (flagged); 128 bytes of 0x80 are not shown as 128 U+FFFD. Every count is made by C code
    (translate, count, a decode): grep_files judges every file's first 8 KiB with it, and a loop
    over the bytes in Python was 80% of a search's time (tests/unit/test_sniff_equivalence.py holds it
    to the per-byte definition)."""
    if not head:
        return False
    if b"\x00" in head or head.startswith(_BINARY_MAGIC):
        return True
    controls = len(head) - len(head.translate(None, _SUSPICIOUS_CONTROLS))
    if controls * 10 > len(head):
        return True
    invalid = 0 if head.isascii() else _invalid_utf8(head)
    # A mostly-ASCII file in windows-1251 or Latin-1 is text in another encoding, not binary.
    return (controls + invalid) * 10 > len(head) and not _legacy_text(head)


_SUSPICIOUS_CONTROLS = bytes(b for b in range(32) if b not in _TEXT_CONTROLS)
_HIGH = bytes(range(0x80, 0x100))
_LETTERS = bytes(range(0xC0, 0x100))


def _invalid_utf8(data: bytes) -> int:
    """How many bytes of `data` are not part of valid UTF-8 (a character cut at the end counts):
    each becomes one lone surrogate when decoded with surrogateescape, and encoding that back with
    errors="ignore" drops exactly those, while everything valid round-trips to its own bytes."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return len(data) - len(data.decode("utf-8", errors="surrogateescape").encode("utf-8", errors="ignore"))
    return 0


def _legacy_text(head: bytes) -> bool:
    """Text in a single-byte encoding: its high bytes are mostly letters (0xC0-0xFF in Latin-1 and
    windows-1251 alike) and it has the spaces and line breaks of text. Dense 0x80-0xBF bytes, or
    high bytes with no whitespace between them, are not text."""
    high = len(head) - len(head.translate(None, _HIGH))
    letters = len(head) - len(head.translate(None, _LETTERS))
    spaces = head.count(b" ") + head.count(b"\t") + head.count(b"\n") + head.count(b"\r")
    return letters * 10 >= high * 6 and spaces * 20 >= len(head)


def _legacy_guess(data: bytes) -> tuple[str, str]:
    """Which single-byte encoding a text that is not UTF-8 most likely is, for the note: Cyrillic
    words are runs of high bytes (windows-1251), Western European text has them one by one (an
    accent in a word: windows-1252, a superset of Latin-1's printable range). The runs are found by
    C code: every high byte made 'x' and every other byte a space, then split."""
    runs = data[: SNIFF_BYTES * 8].translate(_RUN_TABLE).split()
    lengths = sum(map(len, runs))
    if runs and lengths / len(runs) >= 2.5:
        return "cp1251", "windows-1251 (Cyrillic)"
    return "cp1252", "windows-1252 / Latin-1 (Western European)"


_RUN_TABLE = b" " * 0x80 + b"x" * 0x80
