"""Privilege: the box runs as nobody special and can gain nothing."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.docker


def test_runs_as_non_root(victim):
    """Commands (and the agent) run as the workspace owner, uid 1000, never root."""
    assert victim.sh("id -u; id -g").output.split() == ["1000", "1000"]
    assert victim.box.agent_info["uid"] == 1000
    victim.assert_intact()


def test_no_capabilities(victim):
    """Every capability set is empty (/proc/self/status) and no-new-privileges is on."""
    status = dict(
        line.split(":\t", 1) for line in victim.sh("cat /proc/self/status").output.splitlines() if ":\t" in line
    )
    for key in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        if key == "CapAmb" and victim.gvisor and key not in status:
            continue  # gVisor's /proc/self/status has no ambient line
        assert int(status[key], 16) == 0, key
    # PR_GET_NO_NEW_PRIVS (39) asks the kernel itself: gVisor's /proc/self/status has no NoNewPrivs line.
    assert victim.sh("python3 -c 'import ctypes; print(ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))'").output.strip() == "1"
    if "NoNewPrivs" in status or not victim.gvisor:
        assert status["NoNewPrivs"].strip() == "1"
    victim.assert_intact()


def test_setuid_binaries_do_not_elevate(victim):
    """A setuid-root binary (su, mount) and a setuid copy in /tmp give no root."""
    out = victim.sh(
        "su -c id root </dev/null 2>&1; echo rc=$?; mount -t tmpfs none /mnt 2>&1; echo rc=$?; "
        "cp /usr/bin/su /tmp/su && chmod u+s /tmp/su; /tmp/su -c id root </dev/null 2>&1; echo rc=$?; "
        "python3 -c 'import os; os.setuid(0)' 2>&1 | tail -1"
    ).output
    assert "uid=0" not in out
    assert out.count("rc=0") == 0
    assert "PermissionError" in out
    victim.assert_intact()


def test_root_filesystem_is_read_only(victim):
    """The image cannot be changed: the agent's code, /etc and /usr are read-only."""
    out = victim.sh(
        "for f in /opt/openagents/sandbox_agent/server.py /etc/passwd "
        "/usr/bin/evil /x; do echo pwn >> $f 2>&1 || true; done; echo done"
    ).output
    assert out.count("Read-only file system") + out.count("Permission denied") >= 4
    assert victim.sh("grep -c pwn /opt/openagents/sandbox_agent/server.py /etc/passwd").output.count(":0") == 2
    victim.assert_intact()


def test_mount_unshare_and_chroot_fail(victim):
    """mount, unshare (user namespaces) and chroot all fail."""
    out = victim.sh(
        "mount -t proc proc /tmp 2>&1; echo rc=$?; unshare -r id 2>&1; echo "
        "rc=$?; unshare -m true 2>&1; echo rc=$?; chroot / true 2>&1; echo rc=$?"
    ).output
    codes = [line for line in out.splitlines() if line.startswith("rc=")]
    assert len(codes) == 4 and "rc=0" not in codes, out
    victim.assert_intact()


def test_ptrace_of_the_agent_fails(victim):
    """A command cannot ptrace the agent or read its memory (the agent is not dumpable)."""
    code = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print('attach', libc.ptrace(16, 1, 0, 0), ctypes.get_errno())\n"
        "try:\n"
        "    open('/proc/1/mem', 'rb').read(1); print('mem open')\n"
        "except OSError as e:\n"
        "    print('mem', e.errno)\n"
    )
    out = victim.sh(f'python3 -c "{code}"').output
    assert "attach -1 1" in out and "mem 13" in out, out  # EPERM, EACCES
    victim.assert_intact()
