"""grep_files at C speed (sandbox_agent/scan.py: whole blocks of lines, a required-literal pre-filter)
answers exactly as the line-by-line search it replaced (tests/helpers/old_agent.py, the old code verbatim):
the same output, notes and meta, on a tree of tricky files (binary, Latin-1, windows-1251, UTF-16/32
with a byte-order mark and without a valid body, CRLF and lone CRs, long lines, a UTF-8 BOM, the
skipped directories, links, a FIFO) and on random trees, with the bounds at their real values and
shrunk so that small files reach them (the 200-line stop, the long-line cut, a read that ends
inside a line)."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox_agent import search

ROOT = Path(__file__).resolve().parents[2]

PATTERNS = [
    "needle",
    "need",
    "ne+dle",
    "^needle$",
    "needle$",
    "^$",
    "^",
    r"\r",
    "é",
    "\ufffd",
    "caf.",
    "(?i)NEEDLE",
    "Straße",
    "[a-z]+",
    "x{3}",
    "a|needle",
    "needle|zzz",
    r"\x00",
    r"\n",
    r"line \d+",
    "no such thing anywhere",
    "MASKS",
    "kelvin",
    "zweite Zeile",
    "привет",
    "Привет",
    r"\bword\b",
    "(needle)",
    "needle(?=x)",
    "(?<=x)needle",
    "hé",
    "é$",
    " $",
    r"\s$",
    "[^a-z]",
    "hello needle",
    "needle\r",
    "\ufeff",
    "\ufeffneedle",
    "(?x) n e e d l e",
    "ne(?i:EDLE)",
    "[é]x",
]
IGNORE_CASE = ["NEEDLE", "needle", "kelvin", "MASKS", "straße", "İs", "ǅ", "word", "Zeile", "hello NEEDLE"]


def _tricky_tree(root: Path) -> None:
    files: dict[str, bytes] = {
        "a/plain.txt": b"hello needle\nline 2\nanother needle here\n",
        "a/crlf.txt": b"needle one\r\nneedle two\r\n\r\nlast needle\r",
        "a/mixed.txt": b"a\r\nb needle\nc\r\r\nneedle\r\r\n\rneedle\n",
        "a/no_newline.txt": b"first\nneedle at the end",
        "a/cr_only.txt": b"\r",
        "a/empty.txt": b"",
        "a/newline_only.txt": b"\n",
        "a/bom.txt": b"\xef\xbb\xbfneedle after a bom\nsecond\n",
        "a/bom_only.txt": b"\xef\xbb\xbf",
        "a/bom_twice.txt": b"\xef\xbb\xbf\xef\xbb\xbfneedle\n",
        "b/latin1.txt": "café needle\nnaïve\nhé\n".encode("latin-1"),
        "b/latin1_late.txt": b"needle\n" * 300 + "é at the end\n".encode("latin-1"),
        "b/cp1251.txt": "Привет needle\nмир\n".encode("cp1251"),
        "b/utf8.txt": "Straße needle\nпривет мир\nhé\n\ufffd literal replacement char\n".encode(),
        "b/cut_char.txt": "needle é".encode()[:-1] + b"\nneedle\n",
        "b/kelvin.txt": "\u212aelvin MA\u017fKS \u0130s word\n".encode(),
        "b/surrogates.txt": b"needle \xed\xa0\x80 x\n",
        "c/utf16le.txt": b"\xff\xfe" + "needle wide\r\nzweite Zeile\nhé\n".encode("utf-16-le"),
        "c/utf16be.txt": b"\xfe\xff" + "needle wide\nzweite Zeile".encode("utf-16-be"),
        "c/utf32.txt": b"\xff\xfe\x00\x00" + "needle 32\n".encode("utf-32-le"),
        "c/utf16_odd.txt": b"\xff\xfe\nplain needle\n",
        "c/utf16_bad_binary.txt": b"\xff\xfe" + b"\x00\xd8" * 10 + b"\x01\x02\x03" * 100,
        "c/utf16_surrogate_text.txt": b"\xff\xfe" + b"plain text line needle\n" * 3 + b"a\xdc x\n",
        "d/binary_nul.bin": b"needle\x00needle\n",
        "d/png.png": b"\x89PNG\r\n\x1a\n" + b"needle" * 10,
        "d/controls.bin": bytes(range(1, 32)) * 40 + b"needle\n",
        "d/late_nul.txt": b"needle\n" * 2000 + b"\x00",
        "d/high.bin": bytes(range(0x80, 0xC0)) * 200,
        "e/long.txt": b"short needle\n" + b"x" * 5000 + b"needle" + b"y" * 500 + b"\nafter needle\n",
        "e/long_last.txt": b"needle\n" + b"z" * 3000 + b"needle",
        "e/long_utf8.txt": "é".encode() * 2000 + b"\nneedle\n",
        "e/long_cr.txt": b"x" * 999 + b"\r" + b"tail needle\n" + b"needle\n",
        "e/exactly.txt": b"n" * 1000 + b"\n" + b"n" * 999 + b"\n" + b"n" * 1001 + b"\nneedle\n",
        "e/wide_line.txt": b"needle " + b"w" * 900 + b"\n",
        "f/many.txt": b"".join(b"needle %d\n" % i for i in range(260)),
        "f/many_then_bad.txt": b"needle\n" * 12 + b"\xff bad\n" + b"needle\n" * 5,
        "f/words.txt": b"".join(b"line %d word needle hello needle xxx\n" % i for i in range(50)),
        ".git/config": b"needle in git\n",
        "node_modules/m/index.js": b"needle\n",
        "sub/target/out.txt": b"needle\n",
        "sub/dist/out.txt": b"needle\n",
        "sub/targets/kept.txt": b"needle kept\n",
        "sub/.github/w.yml": b"needle yml\n",
        "z/ünïcode nämé.txt": b"needle unicode name\n",
    }
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    (root / "a" / "link_to_plain").symlink_to("plain.txt")
    (root / "linkdir").symlink_to("a")
    os.mkfifo(root / "a" / "fifo")


def _random_tree(root: Path, rng: random.Random) -> None:
    pieces = [
        b"needle",
        b"need",
        b"le",
        b"x",
        b" ",
        b"\n",
        b"\r\n",
        b"\r",
        "é".encode(),
        b"\xe9",
        b"\xc3",
        b"\xef\xbb\xbf",
        "привет".encode(),
        b"word",
        b"\t",
        b"\xff",
        b"line 7",
        b"\n\n",
    ]
    for i in range(60):
        data = b"".join(rng.choice(pieces) for _ in range(rng.choice([0, 1, 5, 50, 400, 3000])))
        if rng.random() < 0.1:
            data = b"\xef\xbb\xbf" + data
        sub = root / f"r{i % 4}"
        sub.mkdir(exist_ok=True)
        (sub / f"f{i:02}.txt").write_bytes(data)


def _compare(root: Path, searches: list[dict], limits: dict | None = None, read_block: int | None = None) -> int:
    spec = root.parent / f"spec-{root.name}.json"
    spec.write_text(
        json.dumps(
            {"limits": limits or {}, "read_block": read_block, "searches": searches}
            if read_block
            else {"limits": limits or {}, "searches": searches}
        )
    )
    env = {**os.environ, "OA_AGENT_WORKSPACE": str(root), "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, "-m", "tests.helpers.old_agent", str(spec)],
        cwd=root,
        env=env,
        capture_output=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr.decode()[-3000:]
    answers = json.loads(run.stdout)
    for (
        _old,
        answer,
    ) in answers:  # the structured hits (exact names) are new: held to the output's lines, then set aside
        hits = answer.get("meta", {}).pop("hits", None)
        if hits is not None:
            shown = answer["output"].split("\n")
            assert len(hits) == answer["meta"]["matches"]
            assert all(
                f"{hit['path']}:{hit['line']}:{hit['text']}" == line
                for hit, line in zip(hits, shown[: len(hits)], strict=True)
                if isinstance(hit["path"], str)
            )
    differ = [(args, old, new) for args, (old, new) in zip(searches, answers, strict=True) if old != new]
    assert differ == [], differ[:3]
    return sum(1 for old, _new in answers if old.get("output", "no matches") != "no matches")


def _searches(paths: list[str]) -> list[dict]:
    out: list[dict] = [{"pattern": p, "path": path} for p in PATTERNS for path in paths]
    out += [{"pattern": p, "ignore_case": True, "path": path} for p in IGNORE_CASE for path in paths]
    out += [{"pattern": "needle", "glob": glob} for glob in ("*.txt", "**/*.bin", "a/*", "{b,c}/*.txt")]
    return out


# (limits, read block): the real bounds; then a 1000-byte line cap with reads smaller than the first
# one (the first read is at least the 8 KiB head); then tiny ones, with a 5-line stop.
BOUNDS = [
    ({}, None),
    ({"GREP_MAX_LINE_BYTES": 1000}, 300),
    ({"GREP_MAX_LINE_BYTES": 50, "GREP_MAX_LINES": 5}, 7),
    ({"GREP_MAX_LINE_BYTES": 4097, "GREP_MAX_LINES": 30}, 4096),
]


@pytest.mark.parametrize("limits, read_block", BOUNDS)
def test_grep_answers_as_the_line_by_line_search_on_tricky_files(
    tmp_path: Path, limits: dict, read_block: int | None
) -> None:
    ws = tmp_path / "ws"
    _tricky_tree(ws)
    paths = [
        ".",
        "a",
        "e",
        "linkdir",
        "a/fifo",
        "a/crlf.txt",
        "b/latin1.txt",
        "c/utf16le.txt",
        "c/utf16_odd.txt",
        "d/png.png",
        "e/long.txt",
    ]
    found = _compare(ws, _searches(paths), limits, read_block)
    assert found > 100  # the searches find things: a comparison of empty answers proves nothing


@pytest.mark.parametrize("seed", range(3))
def test_grep_answers_as_the_line_by_line_search_on_random_trees(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    ws = tmp_path / "ws"
    ws.mkdir()
    _random_tree(ws, rng)
    limits, read_block = BOUNDS[seed % len(BOUNDS)]
    _compare(
        ws,
        [{"pattern": p} for p in PATTERNS] + [{"pattern": p, "ignore_case": True} for p in IGNORE_CASE],
        limits,
        read_block,
    )


def test_the_ascii_letters_that_fold_outside_ascii_are_all_known() -> None:
    """The IGNORECASE needle is lowered ASCII looked for in lowered bytes: sound only if no ASCII
    character it keeps matches a character outside ASCII. Every code point against every ASCII one."""
    beyond_ascii = "".join(map(chr, range(128, 0x110000)))
    outside = {chr(c) for c in range(128) if re.search(re.escape(chr(c)), beyond_ascii, re.IGNORECASE)}
    assert outside == set(search._FOLDS_OUTSIDE_ASCII)


@pytest.mark.parametrize(
    "pattern, flags, needle",
    [
        ("needle", 0, (b"needle", False)),
        ("def \\w+\\(", 0, (b"def ", False)),
        ("foo(a|b)barbaz", 0, (b"barbaz", False)),
        ("a|needle", 0, None),  # an alternation: no run at the top level
        ("ab", 0, None),  # too short to be worth a look
        ("(?i)NEEDLE", 0, (b"needle", True)),
        ("NEEDLE", re.IGNORECASE, (b"needle", True)),
        ("import", re.IGNORECASE, (b"mport", True)),  # i matches U+0130 and U+0131: only the rest is looked for
        ("Straße", re.IGNORECASE, (b"tra", True)),  # S matches the long s, ß is not ASCII
        ("Straße", 0, ("Straße".encode(), False)),
        ("ne(?i:EDLE)x", 0, None),  # the scoped flag is a group
        ("x\ufffdyz", 0, None),  # U+FFFD stands for invalid bytes in the decoded lines: never looked for
        ("(?x) n e e d l e", 0, (b"needle", False)),
    ],
)
def test_the_needle_is_a_run_every_match_contains(pattern: str, flags: int, needle: tuple[bytes, bool] | None) -> None:
    regex = re.compile(pattern, flags)
    assert search._analyse(pattern, regex.flags)[1] == needle
