"""Setuid/setgid plants and dangerous syscalls: refused by the kernel, through the project's seccomp profile.

The box runs as the workspace owner (uid 0 for a root-owned workspace, as in CI), and an owner may
set S_ISUID/S_ISGID on its own files: without the profile, `chmod 4755` in the workspace leaves a
setuid binary on the host's disk. Each scenario runs as uid 1000 on a uid-1000 workspace and as
uid 0 on a root-owned one, tries every route to the bits, then checks the host's copy of the
workspace itself (lstat, no link followed).
"""

from __future__ import annotations

import io
import json
import os
import stat
import tarfile
from pathlib import Path

import pytest

from orchestrator.config import SandboxConfig
from orchestrator.sandbox.docker import DockerSandbox
from orchestrator.sandbox.seccomp import MODE_ARGUMENT, REFUSED, profile_json
from tests.helpers import CANARY, chown_tree, make_workspace, sandbox_config

pytestmark = pytest.mark.docker

BITS = stat.S_ISUID | stat.S_ISGID
SETUID_IN_IMAGE = "/usr/bin/passwd"  # setuid root in the image (Debian's passwd package)
SETGID_IN_IMAGE = "/usr/sbin/unix_chkpwd"  # setgid shadow

# Runs inside the box: every syscall route to a setuid/setgid file, and the refused syscalls.
# Prints {route: [return value, errno]}; x86_64 numbers.
PROBE = r"""
import ctypes, json, mmap, os, stat, struct, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def sc(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    return [r, ctypes.get_errno()]
def py(fn):
    try:
        fn()
        return [0, 0]
    except OSError as e:
        return [-1, e.errno]
d = sys.argv[1]
os.chdir(d)
for name in ("f", "fd"):
    open(name, "w").close()
AT = -100
S = 0o4755
G = 0o2755
out = {}
for label, mode in (("suid", S), ("sgid", G)):
    out[f"os.chmod {label}"] = py(lambda: os.chmod("f", mode))
    fd = os.open("fd", os.O_RDONLY)
    out[f"os.fchmod {label}"] = py(lambda: os.fchmod(fd, mode))
    os.close(fd)
    out[f"os.open O_CREAT {label}"] = py(lambda: os.close(os.open(f"created-{label}", os.O_CREAT | os.O_WRONLY, mode)))
    out[f"os.open O_TMPFILE {label}"] = py(lambda: os.close(os.open(".", os.O_TMPFILE | os.O_WRONLY, mode)))
    out[f"os.mknod {label}"] = py(lambda: os.mknod(f"mknod-{label}", stat.S_IFREG | mode))
    out[f"os.mkdir {label}"] = py(lambda: os.mkdir(f"dir-{label}", mode))
    out[f"sys chmod {label}"] = sc(90, b"f", mode)
    out[f"sys chmod high-garbage {label}"] = sc(90, b"f", (1 << 40) | mode)
    fd = os.open("fd", os.O_RDONLY)
    out[f"sys fchmod {label}"] = sc(91, fd, mode)
    os.close(fd)
    out[f"sys fchmodat {label}"] = sc(268, AT, b"f", mode)
    out[f"sys fchmodat2 {label}"] = sc(452, AT, b"f", mode, 0)
    out[f"sys open {label}"] = sc(2, f"sys-open-{label}".encode(), os.O_CREAT | os.O_WRONLY, mode)
    out[f"sys openat {label}"] = sc(257, AT, f"sys-openat-{label}".encode(), os.O_CREAT | os.O_WRONLY, mode)
    out[f"sys creat {label}"] = sc(85, f"sys-creat-{label}".encode(), mode)
    out[f"sys mknod {label}"] = sc(133, f"sys-mknod-{label}".encode(), stat.S_IFREG | mode, 0)
    out[f"sys mknodat {label}"] = sc(259, AT, f"sys-mknodat-{label}".encode(), stat.S_IFREG | mode, 0)
    out[f"sys mkdir {label}"] = sc(83, f"sys-mkdir-{label}".encode(), mode)
    out[f"sys mkdirat {label}"] = sc(258, AT, f"sys-mkdirat-{label}".encode(), mode)
    out[f"x32 chmod {label}"] = sc(0x40000000 | 90, b"f", mode)
    how = struct.pack("QQQ", os.O_CREAT | os.O_WRONLY, mode, 0)
    out[f"sys openat2 {label}"] = sc(437, AT, f"openat2-{label}".encode(), how, len(how))
# The i386 ABI (int 0x80, chmod = 15) from this 64-bit process: code and path below 4 GiB.
code = mmap.mmap(-1, 4096, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x40, prot=7)  # MAP_32BIT, rwx
base = ctypes.addressof(ctypes.c_char.from_buffer(code))
path = os.path.join(d, "f").encode() + b"\0"
code[2048:2048 + len(path)] = path
code[0:18] = (b"\x53\xb8\x0f\x00\x00\x00\xbb" + struct.pack("<I", base + 2048)
              + b"\xb9" + struct.pack("<I", S) + b"\xcd\x80")
code[18:20] = b"\x5b\xc3"
if base < (1 << 32):
    child = os.fork()
    if child == 0:
        r = ctypes.CFUNCTYPE(ctypes.c_int)(base)()
        os._exit(-r & 0xFF)  # 0 on success, else the errno
    _, status = os.waitpid(child, 0)
    out["i386 int 0x80 chmod suid"] = [0, 0] if status == 0 else [-1, os.waitstatus_to_exitcode(status)]
# Refused outright (EPERM); openat2 is ENOSYS (above).
for name, nr, args in (("io_uring_setup", 425, (8, bytes(120))), ("io_uring_enter", 426, (0, 1, 0, 0, 0, 0)),
                       ("io_uring_register", 427, (0, 0, 0, 0)), ("userfaultfd", 323, (0,)),
                       ("bpf", 321, (0, bytes(128), 128)),
                       ("perf_event_open", 298, (bytes(128), 0, -1, -1, 0)), ("keyctl", 250, (0, -1, 0)),
                       ("add_key", 248, (b"user", b"oa", b"x", 1, -2)), ("request_key", 249, (b"user", b"oa", 0, 0))):
    out[name] = sc(nr, *args)
# File capabilities: a security.capability xattr (CAP_SYS_ADMIN, effective) on a workspace file.
out["setxattr security.capability"] = py(
    lambda: os.setxattr("f", "security.capability", struct.pack("<IIIII", 0x02000001, 1 << 21, 0, 0, 0)))
# Python's own tarfile restores modes with os.chmod (and ignores its failure).
import tarfile
out["python tarfile extractall"] = py(lambda: tarfile.open("/workspace/suid.tar").extractall("pytar"))
out["python tarfile chmod"] = py(lambda: os.chmod("pytar/tar-suid", 0o4755))
print(json.dumps(out))
"""

# Coreutils, install, cp -a/-p of the image's setuid binaries, GNU tar, setgid directories.
SHELL_ROUTES = f"""
set +e
D=$1; cd $D
cp /usr/bin/id tool
chmod 4755 tool; echo "chmod 4755 rc=$?"
chmod 2755 tool; echo "chmod 2755 rc=$?"
chmod u+s tool; echo "chmod u+s rc=$?"
chmod g+s tool; echo "chmod g+s rc=$?"
chmod 6755 tool; echo "chmod 6755 rc=$?"
install -m 4755 /usr/bin/id inst-suid; echo "install -m 4755 rc=$?"
install -m 2755 /usr/bin/id inst-sgid; echo "install -m 2755 rc=$?"
install -d -m 2775 inst-dir; echo "install -d -m 2775 rc=$?"
cp -a {SETUID_IN_IMAGE} cp-a-suid; echo "cp -a suid rc=$?"
cp -p {SETUID_IN_IMAGE} cp-p-suid; echo "cp -p suid rc=$?"
cp -a {SETGID_IN_IMAGE} cp-a-sgid; echo "cp -a sgid rc=$?"
cp --preserve=mode {SETUID_IN_IMAGE} cp-mode-suid; echo "cp --preserve=mode rc=$?"
mkdir sgdir; chmod g+s sgdir; echo "setgid dir rc=$?"
mkdir -m 2775 sgdir2; echo "mkdir -m 2775 rc=$?"
mknod -m 4755 mknod-file p; echo "mknod -m 4755 rc=$?"
mkdir tarx; tar -xpf /workspace/suid.tar -C tarx; echo "tar -xp rc=$?"
mkdir tarx2; tar --same-permissions --no-same-owner -xf /workspace/suid.tar -C tarx2
echo "tar --same-permissions rc=$?"
find . -perm /6000 -printf 'BITS %m %p\\n'
"""

ORDINARY_WORK = """
set -e
cd $1
RUN=$2  # /tmp is noexec: scripts there run through sh
printf '#!/bin/sh\\necho script-ran\\n' > run.sh
chmod +x run.sh && $RUN ./run.sh
chmod 755 run.sh && chmod u+x,g-w,o-w run.sh
mkdir sticky && chmod 1777 sticky && echo "sticky $(stat -c %a sticky)"
install -m 755 run.sh installed.sh && $RUN ./installed.sh
mkdir -p a/b/c && chmod 700 a && chmod -R u+rwX a
python3 -c 'import os; os.umask(0o022); fd = os.open("py.txt", os.O_CREAT | os.O_WRONLY, 0o644); \
os.write(fd, b"ok"); os.close(fd); os.chmod("py.txt", 0o600); \
print("python-ok", oct(os.stat("py.txt").st_mode & 0o7777))'
python3 -c 'open("plain.txt", "w").write("x"); print("open-ok", open("plain.txt").read())'
tar -cf plain.tar run.sh py.txt && mkdir untar && tar -xpf plain.tar -C untar && ls untar | tr '\\n' ' ' && echo tar-ok
cp -a run.sh copied.sh && $RUN ./copied.sh
if command -v git >/dev/null; then git init -q g && \
git -C g -c user.name=t -c user.email=t@t commit -q --allow-empty -m x && echo git-ok; else echo git-absent; fi
echo ordinary-done
"""


def _setuid_archive() -> bytes:
    """A tar with a setuid-root file, a setgid file and a setgid directory, made on the host."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, mode, kind in (
            ("tar-suid", 0o4755, tarfile.REGTYPE),
            ("tar-sgid", 0o2755, tarfile.REGTYPE),
            ("tar-sgid-dir", 0o2775, tarfile.DIRTYPE),
            ("tar-both", 0o6755, tarfile.REGTYPE),
        ):
            info = tarfile.TarInfo(name)
            info.mode, info.type, info.uid, info.gid = mode, kind, 0, 0
            data = b"#!/bin/sh\nid\n" if kind == tarfile.REGTYPE else b""
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _bits_on_host(ws: Path) -> list[str]:
    """Every entry of the host's workspace with S_ISUID or S_ISGID, by lstat (no link followed)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(ws, followlinks=False):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            mode = os.lstat(path).st_mode
            if mode & BITS:
                found.append(f"{oct(mode)} {path.relative_to(ws)}")
    return found


@pytest.fixture
def box(sandbox_image, docker_client, tmp_path, runtime):
    """A sandbox on a uid-1000 workspace. (uid 0 is refused outright, see below; the profile holds for
    root too: test_the_profile_is_what_stops_it runs as uid 0.)"""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "canary.txt").write_text(CANARY)
    ws = make_workspace(tmp_path / "ws", {"README.md": "# victim\n", "suid.tar": _setuid_archive()})
    sandbox = DockerSandbox(ws, sandbox_config(runtime, docker_client), client=docker_client)
    sandbox.start()
    try:
        yield sandbox
    finally:
        sandbox.close()
        assert (outside / "canary.txt").read_text() == CANARY


def _sh(box: DockerSandbox, command: str, timeout: int = 60) -> str:
    result = box.call("shell", {"command": command, "timeout": timeout})
    return result.output


def _write(box: DockerSandbox, rel: str, content: str) -> None:
    result = box.call("write_file", {"path": rel, "content": content})
    assert result.ok, result


def test_setuid_and_setgid_through_every_tool(box):
    """chmod 4755/2755/u+s/g+s, install -m 4755, cp -a/-p of the image's setuid binaries, GNU
    tar -p, mknod and setgid directories, in the workspace and /tmp: every bit refused."""
    _write(box, "routes.sh", SHELL_ROUTES)
    for where in ("/workspace/w", "/tmp/w"):
        out = _sh(box, f"mkdir -p {where} && sh /workspace/routes.sh {where} 2>&1")
        codes = dict(line.rsplit(" rc=", 1) for line in out.splitlines() if " rc=" in line)
        assert len(codes) == 17, out
        # cp and tar drop the bits themselves when they cannot also keep the owner (uid 1000): not asserted.
        for route in (
            "chmod 4755",
            "chmod 2755",
            "chmod u+s",
            "chmod g+s",
            "chmod 6755",
            "install -m 4755",
            "install -m 2755",
            "install -d -m 2775",
            "setgid dir",
            "mkdir -m 2775",
            "mknod -m 4755",
        ):
            assert codes[route] != "0", f"{route} succeeded in {where}:\n{out}"
        assert "Operation not permitted" in out
        assert "BITS" not in out, out
        # The files are there, only the bits are not: the routes really ran.
        listing = _sh(
            box,
            f"cd {where} && stat -c '%a %n' tool inst-suid cp-a-suid "
            "cp-p-suid cp-a-sgid tarx/tar-suid tarx2/tar-both sgdir",
        )
        modes = dict(reversed(line.split(" ", 1)) for line in listing.splitlines())
        assert len(modes) == 8 and modes["tool"] == "755", listing
    assert _bits_on_host(box.workspace) == []


def test_setuid_and_setgid_through_raw_syscalls(box):
    """os.chmod/fchmod/open(O_CREAT|O_TMPFILE)/mknod/mkdir with the bits, the raw
    chmod/fchmodat/fchmodat2/open/openat/creat/mknod(at)/mkdir(at) syscalls, the x32 and i386
    ABIs, a security.capability xattr and Python's tarfile: all refused, openat2 is ENOSYS."""
    _write(box, "probe.py", PROBE)
    results: dict[str, list[int]] = {}
    for where in ("/workspace/p", "/tmp/p"):
        out = _sh(box, f"mkdir -p {where} && python3 /workspace/probe.py {where} 2>&1")
        results = json.loads(out.strip().splitlines()[-1])
        for route, (ret, err) in results.items():
            if route.startswith("sys openat2"):
                # ENOSYS; under gVisor --oci-seccomp every refusal is EPERM (gvisor#14688)
                assert (ret, err) == (-1, 1 if box.runtime.gvisor else 38), f"{route} in {where}: {ret} errno {err}"
            elif route.startswith("i386"):
                assert (ret, err) == (-1, 1), f"{route} in {where}: {ret} exit {err} (EPERM expected)"
            elif route.startswith("setxattr") and box.runtime.gvisor:
                assert ret == -1 and err in (1, 95), (
                    f"{route} in {where}: {ret} errno {err}"
                )  # gVisor: no security.* xattrs (ENOTSUP)
            elif route == "python tarfile extractall":
                continue  # tarfile ignores a failed chmod itself; the find below checks the bits
            else:
                assert (ret, err) == (-1, 1), f"{route} in {where}: {ret} errno {err} (EPERM expected)"
        assert _sh(box, f"find {where} -perm /6000 -printf '%m %p\\n'") == ""
        for name in REFUSED:
            assert name in results, name
        assert {f"sys {name} suid" for name in MODE_ARGUMENT} <= set(results)
    assert _bits_on_host(box.workspace) == []


def test_ordinary_work_still_works(box):
    """chmod 755 and +x, running a script, install -m 755, python file
    I/O, tar without setuid and cp -a all still work under the profile."""
    _write(box, "work.sh", ORDINARY_WORK)
    for where, run in (("/workspace/o", ""), ("/tmp/o", "sh")):
        out = _sh(box, f"mkdir -p {where} && sh /workspace/work.sh {where} {run} 2>&1")
        assert out.count("script-ran") == 3, out
        assert "sticky 1777" in out and "python-ok 0o600" in out and "open-ok x" in out and "tar-ok" in out, out
        assert "git-ok" in out or "git-absent" in out, out
        assert out.rstrip().endswith("ordinary-done"), out
    assert _sh(box, "cd /workspace/o && mkfifo /tmp/fifo && stat -c %F /tmp/fifo && stat -c %a run.sh").split() == [
        "fifo",
        "755",
    ]
    assert (box.workspace / "o" / "run.sh").stat().st_mode & 0o7777 == 0o755
    assert _bits_on_host(box.workspace) == []


def test_the_profile_is_what_stops_it(sandbox_image, docker_client, tmp_path):
    """Control: the same chmod 4755 under the engine's built-in default profile succeeds, and under ours it
    does not. The containers are made with the engine's own settings (engine_settings: under Podman the
    profile as a file and the service's limits), as every box is."""
    from orchestrator.sandbox.engine import engine_settings

    ws = tmp_path / "ctl"
    ws.mkdir()
    script = "cd /w && cp /usr/bin/id tool && chmod 4755 tool; stat -c %a tool"
    results = {}
    for label, opts in (
        ("docker default", ["no-new-privileges"]),
        ("openagents", ["no-new-privileges", "seccomp=" + profile_json()]),
    ):
        settings = engine_settings(
            docker_client,
            {
                "entrypoint": ["sh", "-c"],  # named: Podman 4.3.1 takes an empty one as the image's (the agent)
                "user": "0:0",
                "cap_drop": ["ALL"],
                "security_opt": opts,
                "network_mode": "none",
                "remove": True,
                "volumes": {str(ws): {"bind": "/w", "mode": "rw"}},
                "labels": {"dev.openagents.sandbox.test": "1"},
            },
        )
        out = docker_client.containers.run(sandbox_image, [script], **settings)
        results[label] = out.decode().split()[-1]
        os.remove(ws / "tool")
    assert results == {"docker default": "4755", "openagents": "755"}, results


def test_a_tampered_profile_is_refused():
    """A profile with an unconditional allow for chmod, or a field
    Docker 20.10 would silently ignore, never reaches a sandbox."""
    from orchestrator.sandbox import seccomp

    profile = json.loads(seccomp.PROFILE_PATH.read_text())
    seccomp.validate(profile)
    shadowed = json.loads(json.dumps(profile))
    shadowed["syscalls"].insert(0, {"names": ["chmod"], "action": "SCMP_ACT_ALLOW"})
    unknown = json.loads(json.dumps(profile))
    unknown["defaultErrnoRet"] = 1
    allowed_uring = json.loads(json.dumps(profile))
    allowed_uring["syscalls"].append({"names": ["io_uring_setup"], "action": "SCMP_ACT_ALLOW"})
    for bad in (shadowed, unknown, allowed_uring):
        with pytest.raises(ValueError):
            seccomp.validate(bad)


def test_the_box_never_runs_as_uid_0(sandbox_image, docker_client, tmp_path):
    """A sandbox as uid 0 (explicit, or a root-owned workspace in bind mode) is refused before any container exists."""
    from orchestrator.errors import ErrorType, OpenAgentsError

    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    with pytest.raises(OpenAgentsError) as err:
        DockerSandbox(ws, SandboxConfig(user="0:0"), client=docker_client)
    assert err.value.type == ErrorType.CONFIG_INVALID and "uid 0" in err.value.message
    if os.geteuid() == 0:
        chown_tree(ws, uid=0)
        with pytest.raises(OpenAgentsError):
            DockerSandbox(ws, SandboxConfig(), client=docker_client)
