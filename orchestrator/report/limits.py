"""How much of a session one page holds, and the text every box-written value becomes before the
template sees it.

Every value the box or the model shaped (names, outputs, arguments, diffs, the model's text, the
gate's records of the box's requests) goes through `text()` here: made visible (control, bidi and
format characters shown as escapes, ground.text.visible; invalid UTF-8 was already replaced
by the readers) and cut to its bound with a marker saying how much was cut. The template then
escapes it for HTML (Jinja2's autoescape); nothing box-written is ever marked safe.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..ground.text import visible

MAX_PAGE_BYTES = 8 << 20  # the page, all in: past this it is rendered again with every bound halved


@dataclass(frozen=True)
class Limits:
    """The page's bounds. `halved()` is the next try when a page came out over MAX_PAGE_BYTES."""

    max_entries: int = 2000  # timeline entries (model answers and tool calls)
    max_text: int = 8192  # chars of one argument block, model answer, error or note
    max_output: int = 32768  # chars of one call's output (the tail is kept: a command's end says how it went)
    max_egress: int = 5000  # rows of the gate's audit
    max_diff_lines: int = 20000  # lines of the final diff, all files together
    max_checkpoint_files: int = 50  # names listed per checkpoint
    max_checkpoints: int = 1000  # checkpoint rows
    max_left_out: int = 2000  # rows of what the sanitiser would leave out (and of conflicts)
    timeline_bytes: int = 4 << 20  # what the timeline's texts may cost escaped, all together (Budget)
    diff_bytes: int = 2 << 20  # and the diff's
    checkpoint_bytes: int = 1 << 20  # and the checkpoints' names (the sanitiser's list has as much again)

    def halved(self) -> "Limits":
        return replace(
            self,
            max_entries=max(50, self.max_entries // 2),
            max_text=max(256, self.max_text // 2),
            max_output=max(512, self.max_output // 2),
            max_egress=max(50, self.max_egress // 2),
            max_diff_lines=max(200, self.max_diff_lines // 2),
            max_checkpoint_files=max(5, self.max_checkpoint_files // 2),
            timeline_bytes=self.timeline_bytes // 2,
            diff_bytes=self.diff_bytes // 2,
            checkpoint_bytes=self.checkpoint_bytes // 2,
            max_checkpoints=max(50, self.max_checkpoints // 2),
            max_left_out=max(50, self.max_left_out // 2),
        )


def text(value: object, limit: int, tail: bool = False) -> str:
    """`value` as one visible string of at most about `limit` chars, a cut said in the text."""
    full = "" if value is None else value if isinstance(value, str) else str(value)
    raw = (
        full if len(full) <= 2 * limit else full[-2 * limit :] if tail else full[: 2 * limit]
    )  # only what can be kept is made visible
    shown = visible(raw)
    if len(shown) <= limit and len(raw) == len(full):
        return shown
    limit = min(limit, len(shown))
    cut = len(shown) - limit + len(full) - len(raw)
    if tail:
        return f"…[{cut} chars cut before this]\n{shown[-limit:]}"
    return f"{shown[:limit]}…[cut {cut} chars]"


def page_bytes(shown: str) -> int:
    """What `shown` costs on the page once escaped for HTML (autoescape's five characters grow)."""
    return len(shown.encode("utf-8", "surrogatepass")) + 4 * sum(shown.count(c) for c in "<>&\"'")


class Budget:
    """The page's share for one part (the timeline, the diff): every value kept takes from it by
    what it costs escaped, and once it runs low each further value keeps only `floor` chars, so a
    huge session's page stays within MAX_PAGE_BYTES while every row still says what it was."""

    def __init__(self, total: int, floor: int = 160) -> None:
        self.left, self.floor = total, floor
        self.cut = 0  # values cut short for want of room

    def take(self, value: object, limit: int, tail: bool = False) -> str:
        room = min(limit, max(self.floor, self.left // 2))
        shown = text(value, room, tail)
        if room < limit and len(shown) > room:
            self.cut += 1
        self.left -= page_bytes(shown)
        return shown
