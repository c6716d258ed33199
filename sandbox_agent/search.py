"""grep_files: a regex over the workspace's text files, streamed, with its bounds."""

from __future__ import annotations

import os
import re
import stat

from . import limits
from .globs import compile_glob
from .listing import _skipped_note
from .names import exact
from .paths import local, resolve
from .scan import open_scan, walk_files
from .search_child import _Child, _InProcess, _run_in_process, _run_search
from .tools import ToolError, _arg, _display, _file_type, _os_error, _path_arg, _refuse_trailing_slash

TYPE_CHECKING = False  # not typing's: importing typing costs the agent's start 10-25 ms
if TYPE_CHECKING:
    from typing import Any, Callable, Generator


def grep_files(args: dict[str, Any]) -> dict[str, Any]:
    """A pattern that may backtrack is searched in a forked child with a deadline (GREP_TIMEOUT_S):
    one that backtracks catastrophically is killed and answered as a typed timeout, with what was
    found so far, instead of holding the call until the host's deadline replaces the box. Any other
    is searched in the agent with the same deadline, looked at between files and blocks of lines."""
    pattern = _arg(args, "pattern", str, required=True)
    rel = _path_arg(args, ".")
    glob = _arg(args, "glob", str, None)
    ignore_case = _arg(args, "ignore_case", bool, False)
    try:
        regex = re.compile(pattern, re.IGNORECASE if ignore_case else 0)
    except re.error as err:
        raise ToolError("invalid_regex", f"invalid regular expression: {err}") from None
    matcher = compile_glob(glob) if glob else None
    real = resolve(rel)
    if not os.path.lexists(real):
        raise ToolError("file_not_found", f"{rel}: no such file or directory")
    root = local(real)
    notes: list[str] = []
    if not os.path.isdir(root):
        _refuse_trailing_slash(rel, real)
        notes += _explicit_file_problem(rel, root)
    risky, needle = _analyse(pattern, regex.flags)
    if not risky:
        return _run_in_process(
            lambda reporter: _search(regex, needle, root, matcher, notes, reporter), limits.GREP_TIMEOUT_S
        )
    return _run_search(lambda child: _search(regex, needle, root, matcher, notes, child), limits.GREP_TIMEOUT_S)


_RISKY_OPS = frozenset({"MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT", "GROUPREF", "GROUPREF_EXISTS"})


def _analyse(pattern: str, flags: int) -> tuple[bool, tuple[bytes, bool] | None]:
    """(whether the pattern may backtrack, its needle) from CPython's own parse of it; a pattern
    the parser cannot take again is treated as risky, with no needle."""
    try:
        from re import _parser  # type: ignore[attr-defined]  # CPython's own parser of the pattern

        parsed = _parser.parse(pattern, flags)
    except Exception:  # noqa: BLE001 - compiled already; whatever the parser says, be careful
        return True, None
    return _may_backtrack(parsed, _parser.SubPattern), _needle(parsed.data, flags)


def _may_backtrack(parsed: Any, subpattern: Any) -> bool:
    """Whether a pattern's run time can grow faster than the line times the pattern: any repetition
    (nested or adjacent ones backtrack exponentially or polynomially, and even one `.*x` is
    quadratic on an 8 MiB line) or a backreference. Only those pay for the forked child with its
    deadline (a fork costs tens of milliseconds here); a literal, a class or an alternation of
    them is searched in the agent, as fast as before."""
    stack: list[Any] = [parsed]
    while stack:
        item = stack.pop()
        if isinstance(item, subpattern):
            stack.extend(item.data)
        elif isinstance(item, (list, tuple)):
            if item and str(item[0]) in _RISKY_OPS:
                return True
            stack.extend(item)
    return False


NEEDLE_MIN_CHARS = 3
# ASCII characters that IGNORECASE also matches with a character outside ASCII (U+0130 and U+0131
# for i, the Kelvin sign for k, the long s for s): a lowered ASCII needle would miss those.
# tests/unit/test_grep_equivalence.py checks every code point against every ASCII character.
_FOLDS_OUTSIDE_ASCII = frozenset("iksIKS")


def _needle(top: list[tuple[Any, Any]], flags: int) -> tuple[bytes, bool] | None:
    """(bytes, folded) that every line the pattern matches contains, or None: the longest run of
    literal characters at the pattern's top level (outside any group, class, repetition or
    alternation, which the parser gives as one node), of at least NEEDLE_MIN_CHARS. A line is the
    file's bytes decoded (invalid bytes as U+FFFD, which the needle never holds), so a line that
    contains the characters has their UTF-8 bytes in the file's raw bytes, where scan.py looks.
    With IGNORECASE: only ASCII characters that fold to ASCII alone, lowered, looked for in the
    lowered bytes (bytes.lower() lowers ASCII only)."""
    fold = bool(flags & re.IGNORECASE)
    best: list[str] = []
    run: list[str] = []
    for op, av in [*top, (None, None)]:
        char = chr(av) if str(op) == "LITERAL" else ""
        usable = bool(char) and (
            char.isascii() and char not in _FOLDS_OUTSIDE_ASCII
            if fold
            else char != "\ufffd" and not "\ud800" <= char <= "\udfff"
        )
        if usable:
            run.append(char)
            continue
        if len(run) > len(best):
            best = run
        run = []
    if len(best) < NEEDLE_MIN_CHARS:
        return None
    text = "".join(best)
    return (text.lower().encode("ascii"), True) if fold else (text.encode("utf-8"), False)


SKIP_SHOWN = 10
_SKIP_WHY = {
    "unreadable": "unreadable (permission denied)",
    "binary": "binary",
    "encoding": "not valid in the encoding their byte-order mark names",
    "too_large": f"UTF-16/32 text larger than {limits.EDIT_MAX_FILE_BYTES} bytes",
}


def _search(
    regex: re.Pattern[str],
    needle: tuple[bytes, bool] | None,
    root: str,
    matcher: Callable[[str, str], bool] | None,
    notes: list[str],
    child: _Child | _InProcess,
) -> dict[str, Any]:
    matches: list[str] = []
    hits: list[
        dict[str, Any]
    ] = []  # the same matches, structured: {"path": exact name, "line": n, "text": the line as shown}
    unreadable: list[str] = []
    skipped: dict[str, list[str]] = {kind: [] for kind in _SKIP_WHY}
    not_utf8: list[str] = []
    long_lines: list[str] = []
    cut = 0
    more = False
    needle_bytes, fold = needle if needle else (None, False)
    files = _files(root, unreadable)
    for shown, globbed, name, dir_fd in files:
        if matcher and not matcher(shown, globbed):
            continue
        child.at(shown)
        scan, why = open_scan(name, dir_fd)
        if why:
            skipped[why].append(shown)
        if scan is None:
            continue
        try:
            for number, line in scan.matches(regex, needle_bytes, fold, child.lines):
                if len(matches) >= limits.GREP_MAX_LINES:
                    more = True
                    break
                if len(line) > limits.GREP_LINE_CHARS:
                    cut += 1
                    line = line[: limits.GREP_LINE_CHARS] + f"… [line cut: {len(line)} characters]"
                matches.append(f"{shown}:{number}:{line}")
                hits.append({"path": exact(shown), "line": number, "text": line})
                child.send({"m": matches[-1], "h": hits[-1]})
        finally:
            scan.close()
        if scan.bad:
            not_utf8.append(shown)
        if scan.long:
            long_lines.append(shown)
        if more:
            break
    files.close()
    output = "\n".join(matches) if matches else "no matches"
    if more:
        output += (
            f"\n[truncated: the search stops at {limits.GREP_MAX_LINES} matching lines; narrow the pattern or path]"
        )
    if unreadable:
        notes.append(_skipped_note(unreadable))
    for kind, names in skipped.items():
        if names:
            notes.append(f"[not searched: {_counted(names, 'file')} {_SKIP_WHY[kind]}: {_names(names)}]")
    if not_utf8:
        notes.append(
            f"[{_counted(not_utf8, 'file')} not valid UTF-8 and searched with the invalid bytes as U+FFFD "
            f"(non-ASCII text there may not match): {_names(not_utf8)}]"
        )
    if long_lines:
        notes.append(
            f"[only the first {limits.GREP_MAX_LINE_BYTES} bytes of lines "
            f"longer than that were searched, in: {_names(long_lines)}]"
        )
    if cut:
        notes.append(
            f"[{cut} matching line{'s were' if cut != 1 else ' was'} longer than "
            f"{limits.GREP_LINE_CHARS} characters and cut; read_file shows them whole]"
        )
    counts = {kind: len(names) for kind, names in skipped.items() if names}
    return {
        "output": output,
        "note": "\n".join(notes),
        "meta": {
            "matches": len(matches),
            "truncated": more,
            "lines_cut": cut,
            "unreadable": unreadable[:50],
            "skipped": counts,
            "skipped_files": [f for names in skipped.values() for f in names][:50],
            "hits": hits,
        },
    }


def _counted(items: list[str], noun: str) -> str:
    return f"{len(items)} {noun}{'' if len(items) == 1 else 's'}"


def _names(items: list[str]) -> str:
    return ", ".join(items[:SKIP_SHOWN]) + (f" and {len(items) - SKIP_SHOWN} more" if len(items) > SKIP_SHOWN else "")


def _files(root: str, unreadable: list[str]) -> Generator[tuple[str, str, str, int | None], None, None]:
    """(path shown, path the glob is matched against, name to open, fd of its directory) of each
    regular file under `root`, or `root` itself if it is one (opened by its path, and checked)."""
    if not os.path.isdir(root):
        yield _display(root), os.path.basename(root), root, None
        return
    base = _display(root)
    prefix = "" if base == "." else base + "/"
    for name, rel, dir_fd in walk_files(root, unreadable):
        yield prefix + rel, rel, name, dir_fd


def _explicit_file_problem(rel: str, path: str) -> list[str]:
    """A file the model named is not passed over in silence: unreadable is permission_denied (as
    read_file says), a special file gets a note instead of a bare 'no matches' (a binary one is
    named by the search's own note)."""
    try:
        st = os.lstat(path)
    except OSError as err:
        raise _os_error(err, rel) from None
    if not stat.S_ISREG(st.st_mode):
        return [f"[{rel} is a {_file_type(st.st_mode)}, not a regular file; it was not searched]"]
    if not os.access(path, os.R_OK):
        raise ToolError("permission_denied", f"{rel}: permission denied")
    return []
