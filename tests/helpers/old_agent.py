"""The agent's search and binary check as they were before they ran at C speed (sandbox_agent/
search.py, scan.py, sniff.py at commit 04efd0d), verbatim but for the imports: the reference that
tests/unit/test_grep_equivalence.py and tests/unit/test_sniff_equivalence.py hold the new code to. Run as a
program (`python -m tests.helpers.old_agent SPEC.json`, with OA_AGENT_WORKSPACE set and the workspace as the
working directory: the agent's path checks are relative to it) it prints, for each search in the
spec, the old and the new answer."""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from typing import Any, Callable, Iterable, Iterator

from sandbox_agent import limits
from sandbox_agent.globs import compile_glob
from sandbox_agent.listing import _skipped_note
from sandbox_agent.paths import PathRefused, check_fd, local, resolve
from sandbox_agent.search_child import _Child, _run_search
from sandbox_agent.sniff import _BINARY_MAGIC, BOM, SNIFF_BYTES, _wide_encoding
from sandbox_agent.tools import ToolError, _arg, _display, _file_type, _os_error, _refuse_trailing_slash


class _InProcess:
    """The search's reporting when it runs in the agent itself: nothing to report to."""

    def send(self, message: dict[str, Any]) -> None:
        pass

    def at(self, shown: str) -> None:
        pass


_TEXT_CONTROLS = frozenset(b"\t\n\r\f\b\x1b")


def _looks_binary(head: bytes) -> bool:
    if not head:
        return False
    if b"\x00" in head or head.startswith(_BINARY_MAGIC):
        return True
    controls = sum(1 for b in head if b < 32 and b not in _TEXT_CONTROLS)
    if controls * 10 > len(head):
        return True
    invalid = sum(1 for ch in head.decode("utf-8", errors="surrogateescape") if "\udc80" <= ch <= "\udcff")
    return (controls + invalid) * 10 > len(head) and not _legacy_text(head)


def _legacy_text(head: bytes) -> bool:
    high = sum(1 for b in head if b >= 0x80)
    letters = sum(1 for b in head if b >= 0xC0)
    spaces = sum(1 for b in head if b in b" \t\n\r")
    return letters * 10 >= high * 6 and spaces * 20 >= len(head)


def _invalid_count(head: bytes) -> int:
    return sum(1 for ch in head.decode("utf-8", errors="surrogateescape") if "\udc80" <= ch <= "\udcff")


def _legacy_guess(data: bytes) -> tuple[str, str]:
    runs = lengths = 0
    run = 0
    for b in data[: SNIFF_BYTES * 8]:
        if b >= 0x80:
            run += 1
        elif run:
            runs, lengths, run = runs + 1, lengths + run, 0
    if run:
        runs, lengths = runs + 1, lengths + run
    if runs and lengths / runs >= 2.5:
        return "cp1251", "windows-1251 (Cyrillic)"
    return "cp1252", "windows-1252 / Latin-1 (Western European)"


def _walk(
    start: str, recursive: bool = True, unreadable: list[str] | None = None, dirs_first: bool = False
) -> Iterator[tuple[os.DirEntry[str], bool]]:
    """(entry, is_dir) under `start`, depth first in name order (with `dirs_first`, a directory's
    subdirectories before its files, as Gemini CLI's ls and `tree --dirsfirst` show them; grep keeps
    plain path order). Skipped directories are neither listed nor entered, and nothing is followed
    through a symlink. The start directory must be readable; a subdirectory that is not is passed
    over and named in `unreadable`."""
    stack = [start]
    while stack:
        current = stack.pop()
        try:
            with os.scandir(current) as it:
                items = sorted(it, key=lambda e: (dirs_first and not e.is_dir(follow_symlinks=False), e.name))
        except OSError as err:
            if current == start:
                raise _os_error(err, _display(current)) from None
            if unreadable is not None:
                unreadable.append(_display(current))
            continue
        subdirs = []
        for entry in items:
            is_dir = entry.is_dir(follow_symlinks=False)
            if is_dir and entry.name in limits.LIST_SKIPPED_DIRS:
                continue
            yield entry, is_dir
            if is_dir and recursive:
                subdirs.append(entry.path)
        stack.extend(reversed(subdirs))


def grep_files(args: dict[str, Any]) -> dict[str, Any]:
    """The regex search runs in a forked child with a deadline (GREP_TIMEOUT_S): a pattern that
    backtracks catastrophically is killed and answered as a typed timeout, with what was found so
    far, instead of holding the call until the host's deadline replaces the box."""
    pattern = _arg(args, "pattern", str, required=True)
    rel = _arg(args, "path", str, ".")
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
    if not _may_backtrack(pattern, regex.flags):
        return _search(regex, real, root, matcher, notes, _InProcess())
    return _run_search(lambda child: _search(regex, real, root, matcher, notes, child), limits.GREP_TIMEOUT_S)


_RISKY_OPS = frozenset({"MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT", "GROUPREF", "GROUPREF_EXISTS"})


def _may_backtrack(pattern: str, flags: int) -> bool:
    """Whether a pattern's run time can grow faster than the line times the pattern: any repetition
    (nested or adjacent ones backtrack exponentially or polynomially, and even one `.*x` is
    quadratic on an 8 MiB line) or a backreference. Only those pay for the forked child with its
    deadline (a fork costs tens of milliseconds here); a literal, a class or an alternation of
    them is searched in the agent, as fast as before."""
    try:
        from re import _parser  # type: ignore[attr-defined]  # CPython's own parser of the pattern
    except ImportError:
        return True
    try:
        stack: list[Any] = [_parser.parse(pattern, flags)]
    except Exception:  # noqa: BLE001 - compiled already; whatever the parser says, be careful
        return True
    while stack:
        item = stack.pop()
        if isinstance(item, _parser.SubPattern):
            stack.extend(item.data)
        elif isinstance(item, (list, tuple)):
            if item and str(item[0]) in _RISKY_OPS:
                return True
            stack.extend(item)
    return False


SKIP_SHOWN = 10
_SKIP_WHY = {
    "unreadable": "unreadable (permission denied)",
    "binary": "binary",
    "encoding": "not valid in the encoding their byte-order mark names",
    "too_large": f"UTF-16/32 text larger than {limits.EDIT_MAX_FILE_BYTES} bytes",
}


def _search(
    regex: re.Pattern[str],
    real: str,
    root: str,
    matcher: Callable[[str, str], bool] | None,
    notes: list[str],
    child: _Child | _InProcess,
) -> dict[str, Any]:
    matches: list[str] = []
    unreadable: list[str] = []
    skipped: dict[str, list[str]] = {kind: [] for kind in _SKIP_WHY}
    not_utf8: list[str] = []
    long_lines: list[str] = []
    cut = 0
    more = False
    for file in _walk_files(real, unreadable):
        shown = _display(file)
        if matcher and not matcher(shown, os.path.relpath(file, root) if file != root else os.path.basename(file)):
            continue
        child.at(shown)
        lines, why = _grep_lines(file)
        if why:
            skipped[why].append(shown)
            continue
        bad = long = 0  # the flags seen on any line (see _grep_lines)
        for number, line, flags in lines:
            bad |= flags & 1
            long |= flags & 2
            if regex.search(line):
                if len(matches) >= limits.GREP_MAX_LINES:
                    more = True
                    break
                if len(line) > limits.GREP_LINE_CHARS:
                    cut += 1
                    line = line[: limits.GREP_LINE_CHARS] + f"… [line cut: {len(line)} characters]"
                matches.append(f"{shown}:{number}:{line}")
                child.send({"m": matches[-1]})
        if bad:
            not_utf8.append(shown)
        if long:
            long_lines.append(shown)
        if more:
            break
    output = "\n".join(matches) if matches else "no matches"
    if more:
        output += (
            f"\n[truncated: the search stops at {limits.GREP_MAX_LINES} matching lines; narrow the pattern or path]"
        )
    if unreadable:
        notes.append(_skipped_note(unreadable))
    for kind, files in skipped.items():
        if files:
            notes.append(f"[not searched: {_counted(files, 'file')} {_SKIP_WHY[kind]}: {_names(files)}]")
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
    counts = {kind: len(files) for kind, files in skipped.items() if files}
    return {
        "output": output,
        "note": "\n".join(notes),
        "meta": {
            "matches": len(matches),
            "truncated": more,
            "lines_cut": cut,
            "unreadable": unreadable[:50],
            "skipped": counts,
            "skipped_files": [f for files in skipped.values() for f in files][:50],
        },
    }


def _counted(items: list[str], noun: str) -> str:
    return f"{len(items)} {noun}{'' if len(items) == 1 else 's'}"


def _names(items: list[str]) -> str:
    return ", ".join(items[:SKIP_SHOWN]) + (f" and {len(items) - SKIP_SHOWN} more" if len(items) > SKIP_SHOWN else "")


def _walk_files(real: str, unreadable: list[str]) -> Iterator[str]:
    """Regular files under `real` (or `real` itself if it is one)."""
    start = local(real)
    if not os.path.isdir(start):
        yield start
        return
    for entry, is_dir in _walk(start, unreadable=unreadable):
        if not is_dir and entry.is_file(follow_symlinks=False):
            yield entry.path


def _grep_lines(path: str) -> tuple[Iterable[tuple[int, str, int]], str | None]:
    """(lines, None) or ((), why it is skipped). Lines are (number, text, flags): 1 = not valid
    UTF-8, 2 = cut at GREP_MAX_LINE_BYTES. The file is streamed: no size makes it unsearchable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except PermissionError:
        return (), "unreadable"
    except OSError:
        return (), None  # gone, or swapped for a link since the walk: nothing to search
    try:
        check_fd(fd)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            return (), None
        head = os.pread(fd, SNIFF_BYTES, 0)
    except (OSError, PathRefused):
        os.close(fd)
        return (), None
    wide = _wide_encoding(head)
    if wide:
        try:
            if st.st_size > limits.EDIT_MAX_FILE_BYTES:
                os.close(fd)
                return (), "too_large"
            with os.fdopen(os.dup(fd), "rb") as fh:
                raw = fh.read(limits.EDIT_MAX_FILE_BYTES + 1)
            text = raw[wide[2] :].decode(wide[0])
        except UnicodeDecodeError:
            if _looks_binary(head):
                os.close(fd)
                return (), "encoding"
            wide = None  # the byte-order mark was only a hint: searched as ordinary text
            os.lseek(fd, 0, os.SEEK_SET)
        except OSError:
            os.close(fd)
            return (), None
    if wide:
        os.close(fd)
        return (
            (n, line.removesuffix("\r"), 0)
            for n, line in enumerate(text.split("\n")[:-1] if text.endswith("\n") else text.split("\n"), 1)
        ), None
    if _looks_binary(head):
        os.close(fd)
        return (), "binary"
    return _stream_lines(fd), None


def _stream_lines(fd: int) -> Iterator[tuple[int, str, int]]:
    cap = limits.GREP_MAX_LINE_BYTES
    number = 0
    try:
        with os.fdopen(fd, "rb") as fh:
            while piece := fh.readline(cap):
                number += 1
                flags = 0
                if not piece.endswith(b"\n") and len(piece) >= cap:
                    flags |= 2
                    while (rest := fh.readline(cap)) and not rest.endswith(b"\n"):
                        pass
                if number == 1 and piece.startswith(BOM):
                    piece = piece[len(BOM) :]
                try:
                    line = piece.decode("utf-8")
                except UnicodeDecodeError:
                    line = piece.decode("utf-8", errors="replace")
                    flags |= 1
                yield number, line.removesuffix("\n").removesuffix("\r"), flags
    except OSError:
        return


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


def _answer(tool: Callable[[dict[str, Any]], dict[str, Any]], args: dict[str, Any]) -> dict[str, Any]:
    try:
        return tool(args)
    except (ToolError, PathRefused) as err:
        return {"error": err.kind, "message": str(err)}


def main() -> None:
    """For each search in the spec (argv[1]): [old answer, new answer], as JSON on stdout. The
    spec's `limits` and `read_block` shrink the bounds for both, so small files reach them."""
    from sandbox_agent import scan, search

    spec = json.loads(open(sys.argv[1], encoding="utf-8").read())
    for name, value in spec.get("limits", {}).items():
        setattr(limits, name, value)
    scan.READ_BLOCK = spec.get("read_block", scan.READ_BLOCK)
    print(json.dumps([[_answer(grep_files, args), _answer(search.grep_files, args)] for args in spec["searches"]]))


if __name__ == "__main__":
    main()
