"""Copy mode in ACP: what the user allowed in a prompt turn is on disk when the turn ends.

In copy mode the box works on a private copy, and an editor shows diffs and locations of the
user's own files. So at the end of every prompt turn the turn's changes are carried into the real
workspace by the one sanitiser there is, `review.apply_changes`: regular files, directories,
deletions and inside-pointing relative symlinks; modes normalised; nothing in a `.git`, no FIFO,
device, hard link or absolute symlink (each is left out, with why); and its conflict rule: a path
the user changed in the real workspace since the copy was taken (or since the last landing) is a
conflict, and one conflict means nothing lands. The changes then stay in the copy and the next
turn tries again. Before anything is written the landing meets the ladder's decision
(ApprovalGate.decide_landing, as every front-end's does): a deny rule, copy-only or read-only
refuses it (said in the turn's message and `_meta` error), a rule that asks puts it to the editor.

When the editor offers `fs/write_text_file`, each text file the sanitiser carried is also written
through it, so the editor's buffers hold what is on disk. Its content is the file as it landed,
read back from the real workspace through boxfs (no link followed, regular files only, at most
EDITOR_WRITE_MAX_BYTES, UTF-8 only); nothing else is ever sent. The sanitiser writes first because
it alone decides what may land and checks every conflict before writing anything.

After a landing the manifest is moved on: each landed entry's stamps become the real file as it is
now and the copy as it was scanned before the landing (never after: a change the box made during
the landing shows up again next turn), so the next turn carries only the next turn's changes and
a later `oa-sandbox apply ID` only what never landed. What was left out is said once; a conflict is
said at every turn it still blocks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..api.sessions import land
from ..boxfs import from_store, read_workspace_file, show
from ..boxfs.names import stored_exact, stored_shown
from ..errors import ErrorType, OpenAgentsError
from ..terminal.machine import MAX_LISTED, Bounded, name_item
from ..workspace.copy import CopyManifest
from ..workspace.records import SessionRecord
from ..workspace.review import ApplyReport, Change, Conflict, LeftOut, Normalised, shown
from ..workspace.review.landing import LandingGate

META_KEY = "dev.openagents.sandbox/copyMode"  # the PromptResponse's _meta key (ACP: custom keys are namespaced)
EDITOR_WRITE_MAX_BYTES = 1024 * 1024  # as the diffs: a bigger file lands on disk and is not sent to the editor
MESSAGE_ITEMS = 20  # paths named per list in the editor's message; _meta lists up to META_ITEMS
META_ITEMS = MAX_LISTED

WriteFile = Callable[[str, str], None]  # (the editor's absolute path, text): raises when the editor refuses


@dataclass
class Landing:
    """One turn's landing, for the editor's message and the PromptResponse's _meta."""

    session: str
    workspace: str
    applied: list[str] = field(default_factory=list)  # boxfs.to_store paths
    left_out: list[LeftOut] = field(default_factory=list)  # new this turn
    still_left_out: int = 0  # said at an earlier turn, still not carried
    conflicts: list[Conflict] = field(default_factory=list)
    normalised: list[Normalised] = field(default_factory=list)
    editor_writes: list[str] = field(default_factory=list)
    editor_failures: list[tuple[str, str]] = field(default_factory=list)
    error: str | None = None  # the landing itself could not run (typed message)
    lists_dir: Path | None = None  # where a cut list of _meta is written in full (the session's directory)

    def meta(self) -> dict[str, Any]:
        """Names exact (a string, or {"bytes_b64": ...}), their display forms beside them (`Shown`);
        each list at most META_ITEMS long, with `<key>Total` and `<key>File` (the whole list, a JSONL
        file in the session's directory, when cut): terminal/machine.py's rules, in camelCase."""
        out: dict[str, Any] = {
            "session": self.session,
            "workspace": self.workspace,
            "landed": not self.conflicts and self.error is None,
            "stillLeftOut": self.still_left_out,
        }
        lists = Bounded(out, self.lists_dir, f"acp-{time.time_ns()}", camel=True)
        lists.put("applied", self.applied, name_item, stored_shown)
        lists.put("leftOut", self.left_out, lambda lo: _named(lo.path, reason=show(lo.reason)))
        lists.put("conflicts", self.conflicts, lambda c: _named(c.path, reason=show(c.reason)))
        lists.put("normalised", self.normalised, lambda n: _named(n.path, boxMode=n.box_mode, mode=n.mode))
        lists.put("editorWrites", self.editor_writes, name_item, stored_shown)
        lists.put("editorWriteFailures", self.editor_failures, lambda f: _named(f[0], reason=show(f[1])))
        if self.error:
            out["error"] = self.error
        return {META_KEY: lists.value()}

    def message(self) -> str | None:
        """What the editor's user reads at the end of the turn; None when there is nothing to say."""
        lines: list[str] = []
        if self.error:
            lines.append(
                f"Copy mode: nothing landed in {self.workspace}: {self.error}. The changes stay in the session's copy "
                f"(`oa-sandbox changes {self.session}`)."
            )
        elif self.conflicts:
            lines.append(
                f"Copy mode: nothing landed in {self.workspace}: {_count(self.conflicts, 'conflict')} (changed in your "
                "workspace during the session, and by the agent):"
            )
            lines += _items([f"{shown(c.path)}: {show(c.reason)}" for c in self.conflicts])
            lines.append(
                f"The changes stay in the session's copy (`oa-sandbox changes {self.session}` shows them); every later "
                "prompt tries again, and lands nothing while a conflict remains."
            )
        elif self.applied:
            lines.append(f"Copy mode: landed in {self.workspace}: {_names(self.applied)}.")
        if self.normalised:
            lines.append(
                "Modes normalised: "
                + ", ".join(f"{shown(n.path)} {n.box_mode} -> {n.mode}" for n in self.normalised[:MESSAGE_ITEMS])
                + "."
            )
        if self.left_out:
            lines.append(f"Left out, never carried ({len(self.left_out)}):")
            lines += _items([f"{shown(lo.path)}: {show(lo.reason)}" for lo in self.left_out])
        if self.editor_failures:
            lines.append(
                "On disk, but the editor refused to write "
                + "; ".join(f"{shown(p)} ({show(why)})" for p, why in self.editor_failures[:MESSAGE_ITEMS])
                + "."
            )
        return "\n".join(lines) if lines else None


def _named(path: str, **fields: Any) -> dict[str, Any]:
    return {"path": stored_exact(path), "pathShown": stored_shown(path), **fields}


def _count(items: list[Any], word: str) -> str:
    return f"{len(items)} {word}{'' if len(items) == 1 else 's'}"


def _names(paths: list[str]) -> str:
    more = f" and {len(paths) - MESSAGE_ITEMS} more" if len(paths) > MESSAGE_ITEMS else ""
    return ", ".join(shown(p) for p in paths[:MESSAGE_ITEMS]) + more


def _items(lines: list[str]) -> list[str]:
    more = [f"  ... and {len(lines) - MESSAGE_ITEMS} more"] if len(lines) > MESSAGE_ITEMS else []
    return [f"  {line}" for line in lines[:MESSAGE_ITEMS]] + more


class TurnLander:
    """Lands one copy session's changes at the end of each prompt turn (see the module's docstring)."""

    def __init__(self, record: SessionRecord, editor_root: Path, gate: LandingGate | None) -> None:
        """`gate`: the session's ApprovalGate, whose decide_landing every landing meets (None: refused)."""
        self.record = record
        self.gate = gate
        self.manifest_path = record.manifest_path
        self.editor_root = editor_root
        self.session = record.id
        self._said: set[tuple[str, str]] = set()  # (path, reason) left out and already said

    def land(self, write: WriteFile | None = None) -> Landing:
        landing = Landing(
            session=self.session, workspace=str(self.editor_root), lists_dir=Path(self.record.dir) / "lists"
        )

        def landed(manifest: CopyManifest, scanned: dict[str, Change], report: ApplyReport) -> None:
            """Before the manifest moves on: the editor's writes' stamps become the baseline."""
            self._report(landing, report)
            if write is not None:
                self._write_through(landing, manifest, scanned, write)

        try:
            if self.gate is None:
                raise OpenAgentsError(
                    ErrorType.REFUSED_BY_POLICY, "landing refused: the session has no approval gate to decide it"
                )
            report = land(self.record, gate=self.gate, write_through=landed)  # the one landing (api/sessions.py)
        except OpenAgentsError as err:
            landing.error = f"{err.type.value}: {err.message}"
            return landing
        except OSError as err:
            landing.error = f"io_error: {err.strerror or err}"
            return landing
        if report.conflicts:
            self._report(landing, report)  # nothing was applied: the manifest stays as it was
        return landing

    def _report(self, landing: Landing, report: ApplyReport) -> None:
        landing.applied, landing.conflicts, landing.normalised = report.applied, report.conflicts, report.normalised
        for item in report.left_out:
            key = (item.path, item.reason)
            if key in self._said:
                landing.still_left_out += 1
            else:
                self._said.add(key)
                landing.left_out.append(item)

    def _write_through(
        self, landing: Landing, manifest: CopyManifest, scanned: dict[str, Change], write: WriteFile
    ) -> None:
        """Each text file the sanitiser wrote, as it landed, through the editor's fs/write_text_file."""
        silent = False
        for rel in landing.applied:
            change = scanned.get(rel)
            if change is None or change.after is None or change.after.kind != "file" or change.status == "mode_changed":
                continue
            try:
                path = from_store(rel).decode("utf-8")  # a name the editor can be given
                text = read_workspace_file(manifest.real, from_store(rel), EDITOR_WRITE_MAX_BYTES).decode("utf-8")
            except (OpenAgentsError, UnicodeError):
                continue  # not text, over the cap, or swapped since it landed: on disk, not sent
            if silent:
                landing.editor_failures.append((rel, "not sent: the editor did not answer an earlier write"))
                continue
            try:
                write(str(self.editor_root / path), text)
            except TimeoutError:
                silent = True  # an editor gone quiet is not waited for again, file after file
                landing.editor_failures.append((rel, "the editor did not answer"))
            except Exception as err:  # noqa: BLE001 - an editor's refusal is reported, the file is on disk already
                landing.editor_failures.append((rel, str(err)[:300] or type(err).__name__))
            else:
                landing.editor_writes.append(rel)
