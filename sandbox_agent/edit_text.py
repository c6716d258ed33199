"""The text side of edit_file: finding old_text whatever the line endings, replacing it while every
line keeps its own ending, and the hint when it is not found."""

from __future__ import annotations

import re


def _find_line_ending_blind(text: str, old: str) -> tuple[list[re.Match[str]], int]:
    """(non-overlapping occurrences, occurrences counted at every position) of `old`, where each of
    its line breaks matches LF or CRLF: the model copies text with \n whatever the file uses, and
    mixed files have both. "aa" in "aaa" is there twice (overlapping): that is ambiguous."""
    pieces = old.replace("\r\n", "\n").split("\n")
    pattern = "\r?\n".join(re.escape(p) for p in pieces)
    matches = list(re.finditer(pattern, text))
    if not matches or not _self_overlaps(old):
        return matches, len(matches)
    return matches, sum(1 for _ in re.finditer(f"(?=(?:{pattern}))", text))


def _self_overlaps(old: str) -> bool:
    """Whether two occurrences of `old` can overlap: some proper prefix is also a suffix (its KMP
    border); ignoring line endings, as the search does."""
    s = old.replace("\r\n", "\n")
    border = [0] * len(s)
    k = 0
    for i in range(1, len(s)):
        while k and s[i] != s[k]:
            k = border[k - 1]
        if s[i] == s[k]:
            k += 1
        border[i] = k
    return bool(s) and border[-1] > 0


ALIGN_MAX_LINES = 5000  # past this (old or new), a mixed-ending match maps line breaks by position


def _replace_keeping_endings(text: str, matches: list[re.Match[str]], new: str) -> str:
    """Every line outside the matches keeps its own ending byte for byte. Inside a match, a line of
    the replacement that is a line of the old text (unchanged context) keeps that line's ending; a
    changed line takes the ending of the line it replaces, an added one that of its neighbour
    (for a match within one line, that line's ending; at the end of the file, the file's usual one).
    In a file with both LF and CRLF, inserting a line must not move endings onto untouched lines."""
    usual = "\r\n" if text.count("\r\n") * 2 > text.count("\n") else "\n"
    new_lines = new.replace("\r\n", "\n").split("\n")
    out, last = [], 0
    for m in matches:
        old_lines = re.split("\r?\n", m.group(0))
        breaks = re.findall("\r?\n", m.group(0))
        after = text.find("\n", m.end())
        breaks.append(("\r\n" if after > 0 and text[after - 1] == "\r" else "\n") if after >= 0 else usual)
        out.append(text[last : m.start()])
        chosen = _endings_for(old_lines, breaks, new_lines)
        for j, line in enumerate(new_lines):
            out.append(line if j == len(new_lines) - 1 else line + chosen[j])
        last = m.end()
    out.append(text[last:])
    return "".join(out)


def _endings_for(old_lines: list[str], breaks: list[str], new_lines: list[str]) -> list[str]:
    """The ending of each new line: `breaks[i]` ends old line i (the last, the file's line the match
    ends in)."""
    if len(set(breaks)) == 1 or len(old_lines) > ALIGN_MAX_LINES or len(new_lines) > ALIGN_MAX_LINES:
        return [breaks[min(j, len(breaks) - 1)] for j in range(len(new_lines))]
    import difflib  # only a mixed-ending edit pays for it

    chosen = [breaks[0]] * len(new_lines)
    opcodes = difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False).get_opcodes()
    for tag, i1, i2, j1, j2 in opcodes:
        for j in range(j1, j2):
            if tag in ("equal", "replace"):
                chosen[j] = breaks[min(i1 + (j - j1), i2 - 1)]
            elif tag == "insert":
                chosen[j] = breaks[i1 - 1] if i1 > 0 else breaks[0]
    return chosen


def _line_numbers(text: str, matches: list[re.Match[str]], most: int = 10) -> str:
    numbers, line, pos = [], 1, 0
    for m in matches[:most]:
        line += text.count("\n", pos, m.start())
        pos = m.start()
        numbers.append(str(line))
    return ", ".join(numbers) + (f" and {len(matches) - most} more" if len(matches) > most else "")


HINT_MAX_LINES = 200_000  # past this a failed edit just says "not found"
HINT_FUZZY_MAX_LINES = 5000  # the similar-line search only on files this long...
HINT_FUZZY_MAX_RATIOS = 1500  # ...and with at most this many full comparisons: a failed edit stays cheap
HINT_SHOWN_CHARS = 200


def _closest_hint(text: str, old: str) -> str:
    """Why old_text did not match, when that can be told cheaply: the same text with other whitespace
    (tabs for spaces, indentation, trailing blanks) or other letter case, else the most similar line.
    The model then fixes its copy instead of guessing; the hint never shows more than one line."""
    plain = [ln.rstrip("\r") for ln in text.split("\n")]
    if len(plain) > HINT_MAX_LINES or len(old) > 64 * 1024:
        return "; read the file and copy the text exactly"
    wanted = [p.rstrip("\r") for p in old.replace("\r\n", "\n").strip("\n").split("\n")]
    squashed = ["".join(w.split()) for w in wanted]
    folded = [w.casefold() for w in wanted]
    span = len(wanted)
    if any(squashed):
        lines_squashed = ["".join(ln.split()) for ln in plain]
        for i in range(len(plain) - span + 1):
            if lines_squashed[i] == squashed[0] and lines_squashed[i : i + span] == squashed:
                return (
                    f"; the same text with different whitespace (tabs, spaces or indentation) is at line {i + 1}: "
                    f"{_shown(plain[i])}; copy it exactly, whitespace included"
                )
        for i in range(len(plain) - span + 1):
            if plain[i].casefold() == folded[0] and [ln.casefold() for ln in plain[i : i + span]] == folded:
                return f"; the same text in different letter case is at line {i + 1}: {_shown(plain[i])}"
    first = max(wanted, key=len).strip()
    if not first or len(plain) > HINT_FUZZY_MAX_LINES:
        return "; read the file and copy the text exactly"
    import difflib  # only a failed edit pays for it

    best, best_ratio, budget = -1, 0.6, HINT_FUZZY_MAX_RATIOS
    matcher = difflib.SequenceMatcher(autojunk=False)
    matcher.set_seq2(first[: HINT_SHOWN_CHARS * 2])
    for i, candidate in enumerate(plain):
        stripped = candidate.strip()[: HINT_SHOWN_CHARS * 2]
        if not stripped or abs(len(stripped) - len(first)) > max(len(first), 8):
            continue
        matcher.set_seq1(stripped)
        if matcher.real_quick_ratio() <= best_ratio or matcher.quick_ratio() <= best_ratio:
            continue
        budget -= 1
        if budget < 0:
            break
        ratio = matcher.ratio()
        if ratio > best_ratio:
            best, best_ratio = i, ratio
    if best >= 0:
        return (
            f"; the most similar line is line {best + 1}: "
            f"{_shown(plain[best])}; read the file and copy the text exactly"
        )
    return "; nothing similar is in the file: read it and copy the text exactly"


def _shown(line: str) -> str:
    return repr(line if len(line) <= HINT_SHOWN_CHARS else line[:HINT_SHOWN_CHARS] + "…")
