"""Authority pinned at a session's start (issue 40): which policy and config files granted what,
and the content they had then.

At a session's start every file in force is read once and pinned in the session's record (records.Pin):
its resolved path, the sha256 of its content, whether it lies where a box can write (the workspace, a
session's copy under the state directory), and a copy of the content in the session's directory
(`pins/`, which no box mounts). A resumed session (`run --resume`, `run --continue`, ACP's
session/load) takes a user policy file from its pinned copy, never from the disk again: if the file
on disk differs, that is said on stderr and the pinned content applies. The workspace's own
policies (.openagents/policy.*) can only tighten: a resumed session applies the pinned ones and the
current ones both. The admin policy is the admin's: read afresh each time (a change is said).

A file that lies where a box can write never counts above the workspace tier, whatever tier it
claims and however it was named (--policy, config.toml's `policy`, a batch task): it may only ask
or deny, and one that allows or opens egress is refused at load with a message saying why.
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..boxfs.atomic import write_atomic
from ..boxfs.private import open_private
from ..errors import ErrorType, OpenAgentsError
from ..programs.reach import box_roots as box_roots
from ..programs.reach import reaches
from ..state import config_path
from ..workspace.records import Pin, SessionRecord
from .ladder import POLICY_CAP, PolicyFile, Tier, parse_policy

PINS_DIR = "pins"


@dataclass
class Source:
    """One file's content as it is used in this session (from the disk now, or from its pin)."""

    role: str  # policy | admin_policy | workspace_policy | user_config
    path: Path  # resolved
    raw: bytes
    box_reach: bool
    pinned: bool = False  # taken from the session's pin (not pinned again)


def sha256(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def inside(path: Path, roots: list[Path]) -> bool:
    """Whether the box could change what `path` names (programs/reach.py:
    by spelling, at a link on its way, where it ends)."""
    return reaches(os.path.abspath(path), roots)


def read_file(path: str | Path, what: str = "policy") -> bytes:
    """A file the user named, read with the policy cap (opened normally: process substitution works)."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(POLICY_CAP + 1)
    except OSError as err:
        raise OpenAgentsError(ErrorType.CONFIG_INVALID, f"cannot read {what} {path}: {err.strerror}") from None
    if len(raw) > POLICY_CAP:
        raise OpenAgentsError(ErrorType.CONFIG_INVALID, f"{what} {path}: over the {POLICY_CAP}-byte cap")
    return raw


def parse(source: Source, tier: Tier | None = None) -> PolicyFile:
    """The source as a policy: a file where a box can write is a workspace policy, whatever it says."""
    if not source.box_reach:
        return parse_policy(source.raw, str(source.path), source.path.suffix, tier)
    try:
        return parse_policy(source.raw, str(source.path), source.path.suffix, Tier.WORKSPACE, untrusted=True)
    except OpenAgentsError as err:
        if "workspace policy" not in err.message and "admin-only" not in err.message:
            raise
        raise OpenAgentsError(
            err.type,
            f"{err.message}: {source.path} lies where the sandbox can write (the workspace), so it counts "
            "as a workspace policy whatever tier it claims; keep a policy that allows outside the workspace",
        ) from None


def read_pin(record: SessionRecord, pin: Pin) -> bytes:
    """The pinned copy, from the caller's own session directory: no link followed, bounded, its digest checked."""
    name = pin.pinned
    if "/" in name or name in ("", ".", ".."):
        raise OpenAgentsError(
            ErrorType.CONFIG_INVALID, f"session {record.id}: the pin of {pin.path} names no file of its own"
        )
    try:
        fd = open_private(record.dir / PINS_DIR / name, os.O_RDONLY | os.O_NONBLOCK)
        try:
            st = os.fstat(fd)
            raw = os.read(fd, POLICY_CAP + 1) if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() else None
        finally:
            os.close(fd)
    except OSError as err:
        raise OpenAgentsError(
            ErrorType.CONFIG_INVALID,
            f"session {record.id}: the copy of {pin.path} pinned at its start cannot "
            f"be read ({err.strerror}): not resumed",
        ) from None
    if raw is None or sha256(raw) != pin.sha256:
        raise OpenAgentsError(
            ErrorType.CONFIG_INVALID,
            f"session {record.id}: the copy of {pin.path} pinned at its start has changed: not resumed",
        )
    return raw


def _disk_digest(path: Path) -> str | None:
    try:
        return sha256(read_file(path))
    except OpenAgentsError:
        return None


def say_line(line: str) -> None:
    from ..ground.text import visible

    sys.stderr.write(visible(f"oa-sandbox: {line}") + "\n")
    sys.stderr.flush()


def user_sources(
    files: list[str], workspace: Path, resumed: SessionRecord | None = None, say: Callable[[str], None] = say_line
) -> list[Source]:
    """The user's policy files: from their pins when `resumed` pinned them, else read now."""
    roots = box_roots(workspace)
    pins = {p.path: p for p in (resumed.pins if resumed is not None else []) if p.role == "policy"}
    out = []
    for name in files:
        path = Path(name).resolve()
        pin = pins.get(str(path))
        if resumed is not None and pin is not None:
            raw = read_pin(resumed, pin)
            if _disk_digest(path) != pin.sha256:
                say(
                    f"policy {path} changed since session {resumed.id} started: the session "
                    f"goes on with the content it had then (pinned, sha256 {pin.sha256[:12]}); "
                    "give --policy to start a new session with the new one"
                )
            out.append(Source("policy", path, raw, pin.box_reach or inside(path, roots), pinned=True))
        else:
            out.append(Source("policy", path, read_file(name), inside(path, roots)))
    return out


def pinned_workspace_sources(resumed: SessionRecord | None) -> list[Source]:
    """A resumed session's workspace policies as they were at its start (they only tighten: applied beside today's)."""
    if resumed is None:
        return []
    return [
        Source("workspace_policy", Path(p.path), read_pin(resumed, p), True, pinned=True)
        for p in resumed.pins
        if p.role == "workspace_policy"
    ]


def note_changed(resumed: SessionRecord | None, role: str, path: Path, say: Callable[[str], None] = say_line) -> None:
    """Said on resume when a file read afresh (the admin policy, the user's config) differs from its start."""
    if resumed is None:
        return
    for pin in resumed.pins:
        if pin.role == role and pin.path == str(path) and _disk_digest(path) != pin.sha256:
            say(f"{role.replace('_', ' ')} {path} changed since session {resumed.id} started")


def save(record: SessionRecord, sources: list[Source]) -> None:
    """Pin what was read now (not what came from a pin) in the record and in its directory's pins/."""
    fresh = [s for s in sources if not s.pinned]
    if not fresh:
        return
    folder = record.dir / PINS_DIR
    folder.mkdir(mode=0o700, exist_ok=True)
    for source in fresh:
        digest = sha256(source.raw)
        if any(p.role == source.role and p.path == str(source.path) and p.sha256 == digest for p in record.pins):
            continue
        name = f"{len(record.pins):03d}-{source.role}{source.path.suffix[:16] if source.path.suffix.isascii() else ''}"
        write_atomic(folder / name, source.raw)
        record.pins.append(
            Pin(role=source.role, path=str(source.path), sha256=digest, pinned=name, box_reach=source.box_reach)
        )


def user_config_source(workspace: Path) -> Source | None:
    """The user's config file as it is now (pinned at the start; its defaults are the model, the endpoint, policies)."""
    path = config_path()
    if not path.is_file():
        return None
    try:
        raw = read_file(path, "config")
    except OpenAgentsError:
        return None
    return Source("user_config", path.resolve(), raw, inside(path, box_roots(workspace)))


HOOK_SCRIPT_CAP = 1024 * 1024


def hook_script(record: SessionRecord, workspace: Path, path: Path, resumed: bool) -> Path:
    """A trusted hook's file that lies where the box can write (policy/hook_spec.py box_words), as the
    session runs it: a copy pinned at the session's start (read through boxfs: no link followed,
    regular, capped), so what the box writes there later, this session or before a resume, never
    runs. On resume the start's copy is taken, its digest checked; a file the start did not pin is
    refused."""
    from ..boxfs import read_workspace_file

    rel = os.path.relpath(os.path.normpath(path), workspace)
    if rel.startswith("..") or os.path.isabs(rel):
        raise OpenAgentsError(
            ErrorType.CONFIG_INVALID,
            f"hook file {path}: where the sandbox can write but outside the workspace: not run",
        )
    key = str(Path(workspace) / rel)
    pin = next((p for p in record.pins if p.role == "hook_script" and p.path == key), None)
    if pin is not None:
        copy = record.dir / PINS_DIR / pin.pinned
        raw = _read_capped(copy)
        if raw is None or sha256(raw) != pin.sha256:
            raise OpenAgentsError(
                ErrorType.CONFIG_INVALID,
                f"the copy of hook file {key} pinned at the session's start has changed: not run",
            )
        return copy
    if resumed:
        raise OpenAgentsError(
            ErrorType.CONFIG_INVALID, f"hook file {key} was not pinned at the session's start: not run on resume"
        )
    raw = read_workspace_file(workspace, rel, HOOK_SCRIPT_CAP)
    save(record, [Source("hook_script", Path(key), raw, True)])
    pin = record.pins[-1]
    copy = record.dir / PINS_DIR / pin.pinned
    os.chmod(copy, 0o700)
    return copy


def _read_capped(path: Path) -> bytes | None:
    try:
        fd = open_private(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        return os.read(fd, HOOK_SCRIPT_CAP + 1) if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() else None
    finally:
        os.close(fd)
