"""`oa-sandbox doctor --attack`: a quick subset of the attack battery against the user's own
set-up (whichever backend), so an enterprise can check its installation, not just read our claims."""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..boxfs import BoxDir, remove_path
from ..config import SandboxConfig
from ..protocol import ToolResult
from ..sandbox.backend import backend_from_config
from ..sandbox.base import Backend, Box
from ..tools.defs import read_file, shell

CANARY_VAR = "OA_DOCTOR_CANARY_TOKEN"
CANARY_VALUE = "oa-doctor-canary-5b1e9d"


@dataclass
class Check:
    name: str
    run: Callable[[Box, Path], tuple[bool, str]]


def _shell(box: Box, command: str, timeout: int = 20) -> ToolResult:
    return box.call(shell.TOOL.name, {"command": command, "timeout": timeout})


def _non_root(box: Box, ws: Path) -> tuple[bool, str]:
    out = _shell(box, "id -u").output.strip()
    return out not in ("0", ""), f"uid {out}"


def _no_caps(box: Box, ws: Path) -> tuple[bool, str]:
    out = _shell(box, "grep -E '^Cap(Eff|Prm|Bnd)' /proc/self/status").output
    values = [int(line.split()[1], 16) for line in out.splitlines()]
    return bool(values) and not any(values), "CapEff/CapPrm/CapBnd all 0" if not any(values) else out.strip()


def _no_network(box: Box, ws: Path) -> tuple[bool, str]:
    # /proc/net/dev under both runtimes (gVisor has no /sys/class/net)
    out = _shell(box, "tail -n +3 /proc/net/dev | cut -d: -f1").output.split()
    return out == ["lo"], f"interfaces: {' '.join(out)}"


def _read_only_root(box: Box, ws: Path) -> tuple[bool, str]:
    out = _shell(box, "touch /usr/oa-probe 2>&1; echo rc=$?").output
    return "rc=0" not in out, "writing /usr failed" if "rc=0" not in out else "wrote to /usr"


def _no_secret(box: Box, ws: Path) -> tuple[bool, str]:
    out = _shell(box, "env; tr '\\0' '\\n' < /proc/self/environ").output
    return (
        CANARY_VALUE not in out,
        f"{CANARY_VAR} set on the host, absent in the box" if CANARY_VALUE not in out else "host variable visible",
    )


def _path_escape(box: Box, ws: Path) -> tuple[bool, str]:
    results = [box.call(read_file.TOOL.name, {"path": p}) for p in ("../etc/passwd", "/etc/passwd", "link-out")]
    ok = all(not r.ok and r.error and r.error.type.value == "path_outside_workspace" for r in results)
    return ok, "`..`, absolute and symlinked paths refused" if ok else "a path escaped"


def _git_read_only(box: Box, ws: Path) -> tuple[bool, str]:
    out = _shell(box, "echo x > .git/config 2>&1; echo rc=$?").output
    intact = (ws / ".git" / "config").read_text() == "[core]\n"
    return intact and "rc=0" not in out, ".git is read-only inside the box" if intact else ".git/config changed"


def _timeout(box: Box, ws: Path) -> tuple[bool, str]:
    started = time.monotonic()
    result = _shell(box, "sleep 30", timeout=1)
    elapsed = time.monotonic() - started
    ok = not result.ok and result.error is not None and result.error.type.value == "timeout" and elapsed < 10
    return ok, f"sleep 30 with timeout 1 ended after {elapsed:.1f}s"


def _daemons(box: Box, ws: Path) -> tuple[bool, str]:
    _shell(box, "setsid sleep 300 & nohup sleep 300 >/dev/null 2>&1 &")
    out = _shell(box, "for p in /proc/[0-9]*; do cat $p/comm; done 2>/dev/null").output.split()
    return "sleep" not in out, "no background process outlived its call" if "sleep" not in out else "a daemon survived"


def _no_setuid(box: Box, ws: Path) -> tuple[bool, str]:
    out = _shell(
        box,
        "cp /bin/sh setuid-probe && chmod 4755 setuid-probe; chmod g+s setuid-probe; "
        "python3 -c 'import os; os.close(os.open(\"setgid-probe\", os.O_CREAT, 0o2755))'; echo done",
    ).output
    with BoxDir.open(ws) as top:  # box-written: names and lstat through boxfs, nothing followed
        planted = [os.fsdecode(n) for n in top.names() if top.lstat(n).st_mode & 0o6000]
    ran = (ws / "setuid-probe").is_file() and "done" in out  # the copy was made: only the bit was refused
    detail = (
        f"setuid/setgid on the host: {planted}"
        if planted
        else "chmod 4755, g+s and open(0o2755) refused"
        if ran
        else f"the probe did not run: {out[-200:]}"
    )
    return ran and not planted, detail


def _syscalls_refused(box: Box, ws: Path) -> tuple[bool, str]:
    code = (
        "import ctypes; c = ctypes.CDLL(None, use_errno=True); r = []\n"
        "for nr in (425, 323, 321, 250): c.syscall(nr, 0, 0, 0, 0, 0); r.append(ctypes.get_errno())\n"
        "c.syscall(437, -100, b'x', 0, 0); r.append(ctypes.get_errno()); print(r)"
    )
    out = _shell(box, f'python3 -c "{code}"').output.strip()
    # Under gVisor (runsc --oci-seccomp) every refusal is EPERM, openat2's ENOSYS too (gvisor#14688).
    wanted = "[1, 1, 1, 1, 1]" if box.gvisor else "[1, 1, 1, 1, 38]"
    return (
        out == wanted,
        f"io_uring, userfaultfd, bpf, keyctl EPERM; openat2 {'EPERM' if wanted.endswith('1]') else 'ENOSYS'}"
        if out == wanted
        else f"errnos {out}",
    )


def _agent_restart(box: Box, ws: Path) -> tuple[bool, str]:
    result = _shell(box, "kill 1; sleep 5")
    after = box.call(read_file.TOOL.name, {"path": "probe.txt"})
    ok = result.error is not None and result.error.type.value == "agent_lost" and after.ok
    return ok, "killing the agent is reported and a fresh one takes over" if ok else "the agent was not replaced"


CHECKS = [
    Check("runs as non-root", _non_root),
    Check("no capabilities", _no_caps),
    Check("no network but lo", _no_network),
    Check("read-only root filesystem", _read_only_root),
    Check("host secrets stay out", _no_secret),
    Check("path escapes refused", _path_escape),
    Check(".git read-only", _git_read_only),
    Check("host-enforced timeout", _timeout),
    Check("daemons killed", _daemons),
    Check("no setuid/setgid bit", _no_setuid),
    Check("io_uring, bpf, ... refused", _syscalls_refused),
    Check("agent killed -> replaced", _agent_restart),
]


def run_checks(config: SandboxConfig, backend: Backend | None = None) -> list[tuple[str, bool, str]]:
    root = Path(tempfile.mkdtemp(prefix="oa-doctor-"))
    ws = root / "ws"
    (ws / ".git").mkdir(parents=True)
    (ws / ".git" / "config").write_text("[core]\n")
    (ws / "probe.txt").write_text("probe\n")
    os.symlink("/etc/passwd", ws / "link-out")
    if os.geteuid() == 0 and not config.user:
        for path in (ws, ws / ".git", ws / ".git" / "config", ws / "probe.txt"):
            os.chown(path, 1000, 1000)
        os.lchown(ws / "link-out", 1000, 1000)
    previous = os.environ.get(CANARY_VAR)
    os.environ[CANARY_VAR] = CANARY_VALUE
    rows = []
    try:
        box = (backend or backend_from_config(config)).sandbox(ws, config)
        box.start()
        try:
            for check in CHECKS:
                try:
                    ok, detail = check.run(box, ws)
                except Exception as err:  # a check that crashes has failed
                    ok, detail = False, f"{type(err).__name__}: {err}"
                rows.append((check.name, ok, detail))
        finally:
            box.close()
    finally:
        if previous is None:
            os.environ.pop(CANARY_VAR, None)
        else:
            os.environ[CANARY_VAR] = previous
        remove_path(root)
    return rows
