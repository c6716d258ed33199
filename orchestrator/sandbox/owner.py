"""Who owns a box: the host process that started it, named so that a later process can tell, from
the box's labels alone, whether that owner still runs.

A bare pid is not enough: pids are reused, so "pid 4242 exists" may be someone else's 4242 (then a
leaked box is kept for ever), and a pid seen from another pid namespace or another boot means
nothing here at all (then a live box could be reaped). The owner is therefore named by the boot
(/proc/sys/kernel/random/boot_id), the pid namespace and time namespace (their inodes), the pid and
the process's start time (field 22 of /proc/PID/stat, clock ticks since boot): the same boot, the
same namespaces, the pid present and the same start time is the same process, and nothing else is.

Backend-neutral: a backend stores `Owner.labels()` on what it creates and asks `verdict()` later.
The labels are ours, written at create time, but they are read back from the daemon: parsed with
bounds (digits only, short), and anything garbled is FOREIGN, never a reason to remove.
"""

from __future__ import annotations

import enum
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..config import LABEL

PID_LABEL = f"{LABEL}.host-pid"  # the name older versions used alone: kept, so their filters still work
BOOT_LABEL = f"{LABEL}.owner-boot"
PIDNS_LABEL = f"{LABEL}.owner-pidns"
TIMENS_LABEL = f"{LABEL}.owner-timens"  # absent where the kernel has no time namespaces (< 5.6)
START_LABEL = f"{LABEL}.owner-start"
MACHINE_LABEL = f"{LABEL}.owner-machine"  # absent where /etc/machine-id is missing

PROC = Path("/proc")
STAT_READ_LIMIT = 4096  # /proc/PID/stat is one line of ~300 bytes; comm is at most 15 bytes
STARTTIME_AFTER_COMM = 19  # field 22 counted from 1; fields 3.. follow the ") " that closes comm
_DIGITS = re.compile(r"[0-9]{1,20}")
_BOOT_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_MACHINE_ID = re.compile(r"[0-9a-f]{32}")
_NS_LINK = re.compile(r"[a-z_]+:\[([0-9]{1,20})\]")
MAX_PID = 1 << 22  # the kernel's PID_MAX_LIMIT: larger is no pid


class Verdict(enum.Enum):
    ALIVE = "alive"  # the owner runs: never touch its boxes
    GONE = "gone"  # the owner is certainly gone: its boxes are leftovers
    FOREIGN = "foreign"  # cannot tell from here (another pid namespace or machine, garbled labels): leave alone


@dataclass(frozen=True)
class Owner:
    boot: str
    pidns: int
    timens: int | None
    pid: int
    start: int
    machine: str | None

    def labels(self) -> dict[str, str]:
        labels = {
            PID_LABEL: str(self.pid),
            BOOT_LABEL: self.boot,
            PIDNS_LABEL: str(self.pidns),
            START_LABEL: str(self.start),
        }
        if self.timens is not None:
            labels[TIMENS_LABEL] = str(self.timens)
        if self.machine is not None:
            labels[MACHINE_LABEL] = self.machine
        return labels

    @classmethod
    def from_labels(cls, labels: Mapping[str, object] | None) -> "Owner | None":
        """The owner a box's labels name, or None when any part is missing or not of its shape
        (a box of an older version, or labels someone else wrote)."""
        if not isinstance(labels, Mapping):
            return None
        boot = _match(labels.get(BOOT_LABEL), _BOOT_ID)
        pidns, pid, start = (_number(labels.get(name)) for name in (PIDNS_LABEL, PID_LABEL, START_LABEL))
        if boot is None or pidns is None or pid is None or start is None or not 0 < pid <= MAX_PID:
            return None
        timens = _number(labels.get(TIMENS_LABEL))
        if TIMENS_LABEL in labels and timens is None:
            return None
        machine = _match(labels.get(MACHINE_LABEL), _MACHINE_ID)
        if MACHINE_LABEL in labels and machine is None:
            return None
        return cls(boot=boot, pidns=pidns, timens=timens, pid=pid, start=start, machine=machine)


def _match(value: object, shape: re.Pattern[str]) -> str | None:
    return value if isinstance(value, str) and len(value) <= 64 and shape.fullmatch(value) else None


def _number(value: object) -> int | None:
    text = _match(value, _DIGITS)
    return int(text) if text is not None else None


def parse_start_time(stat: bytes) -> int | None:
    """Field 22 (starttime) of a /proc/PID/stat line. comm, field 2, is in parentheses and may itself
    hold spaces, parentheses and digits: the fields after it begin after the LAST ')'."""
    _, closing, rest = stat[:STAT_READ_LIMIT].rpartition(b")")
    if not closing:
        return None
    fields = rest.split()
    if len(fields) <= STARTTIME_AFTER_COMM:
        return None
    value = fields[STARTTIME_AFTER_COMM]
    return int(value) if value.isdigit() and len(value) <= 20 else None


def start_time(pid: int, proc: Path = PROC) -> int | None:
    """The start time of `pid` as this process sees it; None when it cannot be read."""
    try:
        with open(proc / str(pid) / "stat", "rb") as fh:
            return parse_start_time(fh.read(STAT_READ_LIMIT))
    except OSError:
        return None


def _namespace(kind: str, proc: Path) -> int | None:
    try:
        found = _NS_LINK.fullmatch(os.readlink(proc / "self" / "ns" / kind))
    except OSError:
        return None
    return int(found.group(1)) if found else None


def _read_id(paths: tuple[str, ...], shape: re.Pattern[str]) -> str | None:
    for path in paths:
        try:
            with open(path, encoding="ascii", errors="replace") as fh:
                text = fh.read(128).strip()
        except OSError:
            continue
        if shape.fullmatch(text):
            return text
    return None


_here: tuple[int, Owner] | None = None


def current(proc: Path = PROC) -> Owner:
    """This process as an owner (recomputed after a fork: the child is another owner)."""
    global _here
    pid = os.getpid()
    if _here is not None and _here[0] == pid and proc == PROC:
        return _here[1]
    boot = _read_id((str(proc / "sys/kernel/random/boot_id"),), _BOOT_ID)
    pidns = _namespace("pid", proc)
    start = start_time(pid, proc)
    if boot is None or pidns is None or start is None:
        raise RuntimeError(f"cannot name this process as a sandbox owner: {proc} lacks boot_id, ns/pid or {pid}/stat")
    owner = Owner(
        boot=boot,
        pidns=pidns,
        timens=_namespace("time", proc),
        pid=pid,
        start=start,
        machine=_read_id(("/etc/machine-id", "/var/lib/dbus/machine-id"), _MACHINE_ID),
    )
    if proc == PROC:
        _here = (pid, owner)
    return owner


def labels_here() -> dict[str, str]:
    """This process's owner labels for what it creates. Where it cannot be named (no /proc: not
    Linux), the pid alone, as older versions had it: such boxes are left to `oa-sandbox gc`."""
    try:
        return current().labels()
    except RuntimeError:
        return {PID_LABEL: str(os.getpid())}


def verdict(owner: Owner, here: Owner, proc: Path = PROC) -> Verdict:
    """Whether `owner` still runs, as far as `here` (this process) can know.

    Another boot: every process of it is gone, if it was this machine's boot (same machine id; two
    machines may share one remote daemon, and then the other's boxes are not ours to judge). Another
    pid or time namespace of this boot: its pids and start times mean something else here. Then:
    gone when no process has that pid, or one with another start time has it (the pid was reused).
    A process whose stat we may not read (/proc mounted hidepid) counts as alive: never reap on doubt.
    """
    if owner.boot != here.boot:
        same_machine = owner.machine is not None and owner.machine == here.machine
        return Verdict.GONE if same_machine else Verdict.FOREIGN
    if owner.pidns != here.pidns or owner.timens != here.timens:
        return Verdict.FOREIGN
    if owner.pid == here.pid:
        return Verdict.ALIVE if owner.start == here.start else Verdict.GONE
    if not pid_exists(owner.pid):
        return Verdict.GONE
    started = start_time(owner.pid, proc)
    if started is None:  # unreadable, or it ended between the two looks
        return Verdict.ALIVE if pid_exists(owner.pid) else Verdict.GONE
    return Verdict.ALIVE if started == owner.start else Verdict.GONE


def pid_exists(pid: int) -> bool:
    """Whether this pid namespace has a process `pid` (a zombie counts); pid > 0: never a process group."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's
    return True
