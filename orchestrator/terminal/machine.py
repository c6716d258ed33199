"""Machine output (`run --output json`, stream-json, batch result lines, MCP and ACP results):
names in their one exact form, and every line bounded whatever the box made.

A name is given as boxfs.exact has it (a string when its bytes are valid UTF-8, else
`{"bytes_b64": ...}`), with its display form beside it under the same key plus `_shown`: a list
of names `applied` has `applied_shown`, an object's `path` has `path_shown`.

A list the box can make long (names above all) carries at most MAX_LISTED items, and beside it
`<key>_total` (how many there are) and `<key>_file` (null, or when the list is cut, a JSONL file in
the session's directory holding every item, one a line, written atomically). A line never exceeds
MAX_LINE_BYTES: big texts are cut to their own caps first, then the lists share what is left.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from ..boxfs.atomic import write_atomic
from ..boxfs.names import stored_exact, stored_shown
from ..ground.text import json_line

MAX_LISTED = 1000  # items of one list inline; the rest only in its file
MAX_LINE_BYTES = 1 << 20  # one JSON line (or one --output json object), newline excluded
_SLACK = 4096  # room for the keys and counts a cut adds


def name_item(path: str) -> Any:
    """The exact form of a name kept in boxfs.to_store form."""
    return stored_exact(path)


def named(path: str, **fields: Any) -> dict[str, Any]:
    """An object about one name (kept in to_store form): `path` exact, `path_shown` beside it."""
    return {"path": stored_exact(path), "path_shown": stored_shown(path), **fields}


def write_list(path: Path, items: Iterable[Any]) -> Path:
    """Every item as one JSON line, written to a temporary file beside `path`, synced, renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    return write_atomic(path, "".join(json_line(item) + "\n" for item in items))


@dataclass
class _List:
    key: str
    items: Sequence[Any]
    item: Callable[[Any], Any]
    shown: Callable[[Any], Any] | None
    shown_key: str
    inline: int = 0
    made: list[Any] | None = None  # item() of the first `inline` items, once made
    made_shown: list[Any] | None = None


class Bounded:
    """Builds one bounded JSON object: `put` a long list, `text` a long string, then `line()`.

    `lists_dir` is where cut lists are written (the session's directory/lists), `stem` names this
    output's files there (`<stem>.<key>.jsonl`); without a directory a cut list has no file (null).
    `camel`: the keys beside a list are `<key>Total`, `<key>File`, `<key>Shown` (ACP's _meta)."""

    def __init__(self, out: dict[str, Any], lists_dir: Path | None, stem: str, camel: bool = False) -> None:
        self.out = out
        self.lists_dir = lists_dir
        self.stem = stem
        self.camel = camel
        self._lists: list[_List] = []
        self._texts: dict[str, int] = {}

    def _key(self, key: str, suffix: str) -> str:
        return key + suffix.title() if self.camel else f"{key}_{suffix}"

    def put(
        self,
        key: str,
        items: Sequence[Any],
        item: Callable[[Any], Any] = lambda x: x,
        shown: Callable[[Any], Any] | None = None,
    ) -> None:
        """out[key]: items[:MAX_LISTED] made by `item`; with `shown`, their display forms beside it."""
        entry = _List(key, items, item, shown, self._key(key, "shown"), min(len(items), MAX_LISTED))
        self._lists.append(entry)
        self._fill(entry)

    def text(self, key: str, cap: int, note: str = "") -> None:
        """out[key], a string, cut at `cap` bytes of UTF-8 (with `note` after it when cut)."""
        self._texts[key] = cap
        value = self.out.get(key)
        if isinstance(value, str) and len(value) > cap // 4:
            data = value.encode("utf-8", "surrogatepass")
            if len(data) > cap:
                self.out[key] = data[: max(0, cap - len(note.encode()))].decode("utf-8", "ignore") + note

    def _fill(self, entry: _List) -> None:
        head = entry.items[: entry.inline]
        if entry.made is None:
            entry.made = [entry.item(x) for x in head]
            entry.made_shown = [entry.shown(x) for x in head] if entry.shown is not None else None
        self.out[entry.key] = entry.made[: entry.inline]
        if entry.made_shown is not None:
            self.out[entry.shown_key] = entry.made_shown[: entry.inline]
        self.out[self._key(entry.key, "total")] = len(entry.items)
        file_key = self._key(entry.key, "file")
        if entry.inline < len(entry.items) and self.lists_dir is not None:
            if self.out.get(file_key) is None:
                self.out[file_key] = str(
                    write_list(self.lists_dir / f"{self.stem}.{entry.key}.jsonl", (entry.item(x) for x in entry.items))
                )
        else:
            self.out.setdefault(file_key, None)

    def value(self) -> dict[str, Any]:
        """The object, its lists cut further (and their files written) until its line fits MAX_LINE_BYTES."""
        line = json_line(self.out)
        if len(line.encode("utf-8")) <= MAX_LINE_BYTES:
            return self.out
        for entry in self._lists:
            self.out[entry.key] = []
            self.out.pop(entry.shown_key, None)
        base = len(json_line(self.out).encode("utf-8")) + _SLACK * (1 + len(self._lists))
        share = max(0, MAX_LINE_BYTES - base) // max(1, len(self._lists))
        for entry in self._lists:
            used, n = 0, 0
            for i, made in enumerate(entry.made or []):
                used += len(json_line(made).encode("utf-8")) + 1
                if entry.made_shown is not None:
                    used += len(json_line(entry.made_shown[i]).encode("utf-8")) + 1
                if used > share:
                    break
                n += 1
            entry.inline = n
            self._fill(entry)
        if (
            len(json_line(self.out).encode("utf-8")) > MAX_LINE_BYTES
        ):  # the rest of the object alone is too big: keep what is small
            small = {k: v for k, v in self.out.items() if len(json_line(v).encode("utf-8")) <= _SLACK}
            small["line_cut"] = f"this object was over {MAX_LINE_BYTES} bytes: its larger values are left out"
            self.out = small
        return self.out

    def line(self) -> str:
        return json_line(self.value())


def fit_json(out: dict[str, Any]) -> str:
    """json_line(out), or when over MAX_LINE_BYTES, its small values only (see Bounded.value)."""
    return Bounded(out, None, "").line()
