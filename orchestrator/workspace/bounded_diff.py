"""A unified diff of two texts the box may have written, bounded in time, memory and size.

difflib's SequenceMatcher has inputs that cost minutes for a few kilobytes: lines that each recur
just under its autojunk bound (1 % of the lines) in a different order on each side make it walk
every candidate for every line at each level of its recursion (10,000 such lines, 29 KB, took
16 s here; 180,000 lines, 900 KB, took 261 s). A box can write such a file. So the diff runs
in a child process (this file run with `python -I`; it imports nothing of ours) with CPU and memory
limits, killed at a deadline that starts once it has started, and it writes at most `max_bytes`
of diff. The texts are the caller's to bound (their size is the child's input).

    bounded_unified_diff(before, after, "a/x", "b/x", max_bytes=64 << 10, deadline_s=2.0)

gives a BoundedDiff: the text (cut at `max_bytes` when `cut`), or None with `skipped`, one line of
ours that never quotes the input. Lines are split at "\\n" only, and a last line without one gets
git's "\\ No newline at end of file". The text is the box's: make it visible before showing it.
"""

from __future__ import annotations

import difflib
import os
import struct
import sys
from dataclasses import dataclass
from typing import Iterator

START_SECONDS = 10.0  # for the child's interpreter and imports, before the deadline's clock starts
WHOLE, CUT = b"=", b"C"
_CHILD_MEMORY = 512 * 1024 * 1024
_ENCODING = ("utf-8", "surrogatepass")  # a model's JSON may hold a lone surrogate; it goes through as it is


@dataclass(frozen=True)
class BoundedDiff:
    text: str | None = None  # the unified diff ("" when nothing differs); None when skipped
    cut: bool = False  # the text stops at max_bytes (its last line may be partial)
    skipped: str | None = None  # why there is no text: ours, e.g. "the diff took longer than 2 s"


def bounded_unified_diff(
    before: str, after: str, from_name: str, to_name: str, *, max_bytes: int, deadline_s: float, context: int = 3
) -> BoundedDiff:
    """The unified diff from `before` to `after`, made in a child process killed after
    `deadline_s` seconds of diffing, at most `max_bytes` of UTF-8. Never raises for the input's sake."""
    payload = b"".join(
        struct.pack("!Q", len(blob)) + blob
        for blob in (s.encode(*_ENCODING) for s in (from_name, to_name, before, after))
    )
    from ..ground.deadline import ChildStopped, Stopped, run_with_deadline

    cpu = max(1, int(deadline_s) + 1)
    try:
        code, out = run_with_deadline(
            os.path.abspath(__file__), [str(max_bytes), str(context), str(cpu)], payload, deadline_s, START_SECONDS
        )
    except ChildStopped as stop:
        return BoundedDiff(
            skipped={
                Stopped.NOT_STARTED: f"the differ did not start within {START_SECONDS:g} s",
                Stopped.TIMED_OUT: f"the diff took longer than {deadline_s:g} s",
            }.get(stop.how, f"the differ failed ({stop.detail})")
        )
    if code != 0 or out[:1] not in (WHOLE, CUT) or len(out) - 1 > max_bytes:
        return BoundedDiff(skipped=f"the differ failed (exit {code}: over its CPU or memory limit?)")
    return BoundedDiff(text=out[1:].decode(*_ENCODING), cut=out[:1] == CUT)


def split_lines(text: str) -> list[str]:
    """Lines with their "\\n", split at "\\n" only (not at \\r, \\f, \\x1c or U+2028 as str.splitlines does)."""
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def diff_lines(before: str, after: str, from_name: str, to_name: str, context: int = 3) -> Iterator[str]:
    """In this process, unbounded: what the child runs. Each item ends with "\\n"."""
    for line in difflib.unified_diff(split_lines(before), split_lines(after), from_name, to_name, n=context):
        yield line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"


def _prefix(line: str, room: int) -> str:
    """The longest start of `line` whose encoding fits in `room` bytes."""
    head = line[:room]
    while len(head.encode(*_ENCODING)) > room:
        head = head[: len(head) - max(1, (len(head.encode(*_ENCODING)) - room) // 4)]
    return head


def _child(max_bytes: int, context: int, cpu_seconds: int) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds))
    resource.setrlimit(resource.RLIMIT_AS, (_CHILD_MEMORY, _CHILD_MEMORY))
    sys.stdout.buffer.write(b"R")  # started and imported: the parent's clock starts now
    sys.stdout.buffer.flush()
    raw = sys.stdin.buffer.read()
    blobs, at = [], 0
    for _ in range(4):
        (size,) = struct.unpack_from("!Q", raw, at)
        blobs.append(raw[at + 8 : at + 8 + size].decode(*_ENCODING))
        at += 8 + size
    del raw
    out, used, flag = [], 0, WHOLE
    for line in diff_lines(blobs[2], blobs[3], blobs[0], blobs[1], context):
        data = line.encode(*_ENCODING)
        if used + len(data) > max_bytes:
            flag = CUT
            if max_bytes - used > 1:
                out.append(_prefix(line, max_bytes - used - 1).encode(*_ENCODING) + b"\n")
            break
        out.append(data)
        used += len(data)
    sys.stdout.buffer.write(flag + b"".join(out))


if __name__ == "__main__":
    _child(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
