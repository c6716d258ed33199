"""The binary check at C speed (sandbox_agent/sniff.py) judges every head exactly as the per-byte
definition it replaced does: real files' first 8 KiB, random bytes, and heads built to sit on each
threshold (10% controls, 10% invalid UTF-8, the Latin-1/windows-1251 exception, characters cut at
the end). The reference is the old code, verbatim (tests/helpers/old_agent.py)."""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import pytest

from sandbox_agent import sniff
from tests.helpers import old_agent as old


def _real_heads(limit: int = 4000) -> list[bytes]:
    """First 8 KiB of real files: this interpreter's library and site-packages (text, compiled
    modules, shared objects, data files)."""
    heads = []
    roots = {Path(os.__file__).parent, *(Path(p) for p in sys.path if p.endswith("site-packages"))}
    for root in sorted(roots):
        for dirpath, _dirs, files in os.walk(root):
            for name in files:
                try:
                    with open(os.path.join(dirpath, name), "rb") as fh:
                        heads.append(fh.read(sniff.SNIFF_BYTES))
                except OSError:
                    continue
                if len(heads) >= limit:
                    return heads
    return heads


def _random_heads(rng: random.Random) -> list[bytes]:
    heads = []
    alphabets = [
        bytes(range(256)),
        bytes(range(1, 256)),
        bytes(range(0x80, 0x100)) + b" \n",
        b"ab \n\x01\x02\x1b\x7f",
        "héllo wörld привет мир 日本語 \n".encode() + b"\x80\xc3\xe2\x82",
        "é".encode("latin-1") + b"abc \n",
    ]
    for _ in range(3000):
        alphabet = rng.choice(alphabets)
        size = rng.choice([1, 2, 3, 7, 64, 500, 4096, 8192])
        heads.append(bytes(rng.choice(alphabet) for _ in range(size)))
    return heads


def _adversarial_heads(rng: random.Random) -> list[bytes]:
    """Heads on each threshold, with the mark on either side of it."""
    heads = []
    text = b"plain text, with spaces\n" * 400
    for n in range(len(text) // 10 - 3, len(text) // 10 + 4):  # around 10% controls
        heads.append(b"\x01" * n + text[n:])
        heads.append(b"\x01" * n + text[n:] + b"\xe9" * 20)
    base = (b"word " * 20 + b"\n") * 60
    for per_line in (0, 1, 5, 10, 11, 12, 13, 20, 40):  # Latin-1 letters, then 0x80-0xBF bytes, at growing density
        for byte in (b"\xe9", b"\x93", b"\xc3", b"\xff"):
            lines = [line[:-1] + byte * per_line + b"\n" for line in base.split(b"\n") if line]
            heads.append(b"".join(lines)[: sniff.SNIFF_BYTES])
    cyrillic = "Привет, мир! Это обычный текст.\n".encode("cp1251") * 300
    heads += [
        cyrillic[: sniff.SNIFF_BYTES],
        cyrillic.replace(b" ", b"")[: sniff.SNIFF_BYTES],
        cyrillic.replace(b"\n", b"")[:8000],
    ]
    utf8 = "naïve café – “quotes” 😀 日本\n".encode() * 300
    for cut in range(1, 6):  # a character cut at the end of the head
        heads.append(utf8[: sniff.SNIFF_BYTES - cut])
        heads.append(utf8[: sniff.SNIFF_BYTES - 8 - cut] + b"\xf0\x9f\x98")
    heads += [
        b"\xed\xa0\x80" * 100,
        b"\xc0\xaf" * 200,
        b"\xf4\x90\x80\x80" * 100,
        b"\xef\xbb\xbf" + b"x" * 100,
        b"\x1b[31mred\x1b[0m\n" * 200,
        b"\x0c\x08" * 50 + b"a" * 900,
        b"\x7fELF",
        b"\x89PNG\r\n\x1a\n",
        b"%PDF-1.7\n",
    ]
    for _ in range(500):  # text with a few bytes changed at random
        head = bytearray(utf8[: rng.randrange(1, sniff.SNIFF_BYTES)])
        for _ in range(rng.randrange(0, 200)):
            head[rng.randrange(len(head))] = rng.randrange(1, 256)
        heads.append(bytes(head))
    return heads


@pytest.fixture(scope="module")
def heads() -> list[bytes]:
    rng = random.Random(20261207)
    return _real_heads() + _random_heads(rng) + _adversarial_heads(rng)


def test_the_binary_check_judges_every_head_as_the_per_byte_definition(heads: list[bytes]) -> None:
    assert len(heads) > 5000
    mismatches = [head[:40] for head in heads if sniff._looks_binary(head) != old._looks_binary(head)]
    assert mismatches == []
    verdicts = {old._looks_binary(head) for head in heads}
    assert verdicts == {True, False}  # the set holds both kinds


def test_each_count_matches_the_per_byte_one(heads: list[bytes]) -> None:
    """The parts on their own, so a threshold that happens to agree cannot hide a wrong count."""
    assert [sniff._invalid_utf8(h) for h in heads] == [old._invalid_count(h) for h in heads]
    assert [sniff._legacy_text(h) for h in heads] == [old._legacy_text(h) for h in heads]
    assert any(old._invalid_count(h) for h in heads) and any(old._legacy_text(h) for h in heads)


def test_the_encoding_guess_matches_the_per_byte_one(heads: list[bytes]) -> None:
    assert [sniff._legacy_guess(h * 3) for h in heads] == [old._legacy_guess(h * 3) for h in heads]
    assert {old._legacy_guess(h)[0] for h in heads} == {"cp1251", "cp1252"}
