"""Attacks on copy-on-write forks (issue 37: workspace/cow.py, overlay.py, fork.py): a real box
writes in the parent's copy (or in a fork, before it is forked again), then the parent is forked.

What a box wrote is frozen into a read-only layer that every fork stands on, so whatever it planted
must be inert there as in a data copy (no FIFO, socket or device, no setuid/setgid, every entry the
sandbox user's, links kept as links and never followed), overlayfs's own metadata must not be
forgeable (the box sets user.overlay.* xattrs; trusted.* it may not set; we never mount with
userxattr), a whiteout is a deletion for `changes`/`apply` and never a device on the host, and a
freeze that cannot finish (a tree deeper than the walk enters) is a typed error that leaves the
parent as it was. Chains of forks and concurrent forks of one parent keep every layer.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.boxfs import from_store
from orchestrator.errors import ErrorType, OpenAgentsError
from tests.helpers import SANDBOX_UID, chown_tree, make_workspace

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or __import__("orchestrator.workspace.overlay", fromlist=["unusable"]).unusable() is not None,
    reason="overlay forks need a host that may mount (root)",
)

ROOT = Path(__file__).resolve().parents[2]
BAD_NAMES = (b"new\nline", b"bad\xffutf8", b"esc\x1b[2J")


def no_box(path: str) -> bool:
    """These copies never had a box: nothing holds them (fork_session's box_on_copy)."""
    return False


def _parent(tmp_path: Path, monkeypatch, state: str = "state") -> str:
    """An ended copy session of a real workspace (as `run --workspace-mode copy` leaves one)."""
    from orchestrator.workspace.records import WorkspaceMode, prepare

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / state))
    monkeypatch.setenv("OA_FORK_COW", "auto")
    # overlays all the way down: a copy (or a fork's upper) on a file system of its own (quota_fs)
    # forks as a data copy, which these attacks on the overlay's layers would not reach
    monkeypatch.setenv("OA_WRITE_QUOTA_FS", "watch")
    ws = make_workspace(tmp_path / "ws", {"a.txt": "alpha\n", "b.txt": "beta\n", "sub/c.txt": "gamma\n"})
    record, _ = prepare(ws, WorkspaceMode.COPY, None)
    record.status, record.host_pid = "finished", 0
    record.save()
    return record.id


def _in_box(open_sandbox, copy: Path, script: str) -> str:
    """Run `script` as the sandbox user in a real box on `copy`, then stop the box (a fork is of an ended session)."""
    box = open_sandbox(copy, user=f"{SANDBOX_UID}:{SANDBOX_UID}")
    try:
        result = box.call("shell", {"command": script, "timeout_s": 120})
        assert result.ok, result
        return str(result.output)
    finally:
        box.close()


def _entries(root: Path) -> dict[bytes, os.stat_result]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(os.fsencode(root)):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            out[os.path.relpath(path, os.fsencode(root))] = os.lstat(path)
    return out


def _layer_is_inert(layer: Path) -> None:
    for rel, st in _entries(layer).items():
        if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
            continue  # an upper's whiteout, overlayfs's
        assert stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode), (rel, oct(st.st_mode))
        assert not st.st_mode & (stat.S_ISUID | stat.S_ISGID), (rel, oct(st.st_mode))
        assert (st.st_uid, st.st_gid) == (SANDBOX_UID, SANDBOX_UID), (rel, st.st_uid)
        for attr in os.listxattr(os.path.join(os.fsencode(layer), rel), follow_symlinks=False):
            assert not attr.startswith("trusted."), (rel, attr)


PLANT = r"""
echo run > suid && chmod 6755 suid
mkfifo fifo
python3 - <<'PY'
import os, socket
s = socket.socket(socket.AF_UNIX); s.bind("sock")
for raw in [b"new\nline", b"bad\xffutf8", b"esc\x1b[2J"]:
    open(raw, "wb").write(b"box\n")
open("linked", "w").write("one inode\n"); os.link("linked", "linked2")
for target in ("/etc/passwd", "/proc/self/exe"):
    try:
        os.link(target, "out.hl"); print("LINKED-OUT", target)
    except OSError as err:
        print("no link out", target, err.errno)
os.symlink("/etc/shadow", "shadow.lnk"); os.symlink("../../../../..", "up.lnk")
os.symlink(os.environ["LAYERS"], "layers.lnk")
os.makedirs("work/work"); open("work/work/f", "w").write("named like overlay's work dir\n"); os.makedirs("upper/index")
os.makedirs("opq"); open("opq/kept", "w").write("kept\n")
for attr, value in (("user.overlay.opaque", b"y"), ("user.overlay.redirect", b"/sub"), ("user.note", b"box")):
    try:
        os.setxattr("opq", attr, value); print("set", attr)
    except OSError as err:
        print("refused", attr, err.errno)
for attr in ("trusted.overlay.opaque", "trusted.overlay.redirect", "security.capability"):
    try:
        os.setxattr("opq", attr, b"y"); print("SET", attr)
    except OSError as err:
        print("refused", attr, err.errno)
PY
echo planted
"""


@pytest.mark.docker
def test_a_box_planted_parent_is_frozen_inert_and_every_fork_sees_it_inert(tmp_path, monkeypatch, open_sandbox):
    """The box plants a setuid/setgid file, a FIFO, a socket, a hard-link pair, links out (to /etc, up the tree,
    to the layers' host path), directories named like overlay's work and upper, newline / invalid-UTF-8 / escape
    names and overlay xattrs (trusted.* refused): the frozen layer and both forks hold none of the specials, no
    setuid bit, no trusted.* xattr, links kept as links, and a write through one fork reaches no other."""
    from orchestrator.workspace.copy import CopyManifest
    from orchestrator.workspace.fork import fork_session
    from orchestrator.workspace.overlay import layers_root
    from orchestrator.workspace.records import open_own_record
    from orchestrator.workspace.review import list_changes

    sid = _parent(tmp_path, monkeypatch)
    parent = open_own_record(sid)
    out = _in_box(open_sandbox, Path(parent.box_workspace), f"export LAYERS={layers_root()}\n{PLANT}")
    assert "planted" in out and "LINKED-OUT" not in out and "SET " not in out, out
    copy = Path(parent.box_workspace)
    # what our seccomp profile refuses the box (chmod +s) and what gVisor keeps in its own kernel (FIFOs,
    # sockets), set from the host as a runtime without them would let the box
    os.chmod(copy / "suid", 0o6755)
    if not os.path.lexists(copy / "fifo"):
        os.mkfifo(copy / "fifo")
        os.chown(copy / "fifo", SANDBOX_UID, SANDBOX_UID)
    forks = fork_session(sid, 2, box_on_copy=no_box)
    parent = open_own_record(sid)
    assert parent.cow is not None and all(f.cow is not None and f.cow.lowers == parent.cow.lowers for f in forks)
    layer = Path(parent.cow.lowers[0])
    _layer_is_inert(layer)
    for fork in [parent, *forks]:
        copy = Path(fork.box_workspace)
        for name in ("fifo", "sock", "out.hl"):
            assert not os.path.lexists(copy / name)
        assert stat.S_IMODE(os.lstat(copy / "suid").st_mode) == 0o755
        assert os.readlink(copy / "shadow.lnk") == "/etc/shadow" and os.readlink(copy / "layers.lnk") == str(
            layers_root()
        )
        assert (copy / "work" / "work" / "f").read_text() == "named like overlay's work dir\n" and (
            copy / "opq" / "kept"
        ).is_file()
        for raw in BAD_NAMES:
            assert (Path(os.fsdecode(os.fsencode(copy) + b"/" + raw))).read_bytes() == b"box\n"
    for i, fork in enumerate(forks):
        copy = Path(fork.box_workspace)
        (copy / "linked").write_text(f"fork {i}\n")
        chown_tree(copy)
        paths = {from_store(c.path) for c in list_changes(CopyManifest.load(fork.manifest_path))}
        assert {b"suid", b"shadow.lnk", b"layers.lnk", b"work", b"linked", *BAD_NAMES} <= paths
        assert not {b"fifo", b"sock"} & paths
    assert (Path(forks[0].box_workspace) / "linked").read_text() == "fork 0\n"
    assert (Path(forks[1].box_workspace) / "linked").read_text() == "fork 1\n"
    assert (Path(parent.box_workspace) / "linked").read_text() == (layer / "linked2").read_text() == "one inode\n"
    assert sorted(os.listdir(tmp_path / "ws")) == ["a.txt", "b.txt", "sub"]  # nothing reached the real workspace


def _mount_options(target: Path) -> bytes:
    with open("/proc/self/mountinfo", "rb") as fh:
        for line in fh:
            fields = line.split(b" ")
            if fields[4] == os.fsencode(target):
                return fields[fields.index(b"-") + 3]
    raise AssertionError(f"{target} is not mounted")


XATTRS_AND_DELETES = r"""
python3 - <<'PY'
import os
open("wh", "w").close()
# were they honoured: sub/c.txt would vanish from the next layer's view, a.txt show b.txt, wh hide itself
for path, attr, value in (("sub", "user.overlay.opaque", b"y"), ("a.txt", "user.overlay.redirect", b"/b.txt"),
                          ("wh", "user.overlay.whiteout", b""), ("sub", "trusted.overlay.opaque", b"y")):
    try:
        os.setxattr(path, attr, value); print("set", attr)
    except OSError as err:
        print("refused", attr, err.errno)  # (gVisor keeps no user xattrs on this mount)
PY
rm b.txt
mknod dev0 c 0 0 2>/dev/null && echo MKNOD || echo no mknod
echo deleted
"""


@pytest.mark.docker
def test_overlay_xattrs_and_whiteouts_written_in_a_fork_are_never_trusted_by_the_next_fork(
    tmp_path, monkeypatch, open_sandbox
):
    """A box in a fork sets user.overlay.opaque/redirect/whiteout, deletes a file (a whiteout in its upper)
    and tries mknod c 0 0; the fork is forked again: the mount has no userxattr, the forged xattrs hide or
    redirect nothing, the deleted file is gone in the fork of the fork, `changes` calls it a deletion and
    `apply` deletes it on the host without making a device; the parent and the sibling still have it."""
    from orchestrator.workspace.copy import CopyManifest
    from orchestrator.workspace.fork import fork_session
    from orchestrator.workspace.review import apply_changes, list_changes

    sid = _parent(tmp_path, monkeypatch)
    one, sibling = fork_session(sid, 2, box_on_copy=no_box)
    out = _in_box(open_sandbox, Path(one.box_workspace), XATTRS_AND_DELETES)
    assert "deleted" in out and "MKNOD" not in out and "set trusted" not in out, out
    (grand,) = fork_session(one.id, 1, box_on_copy=no_box)
    assert grand.cow is not None and len(grand.cow.lowers) == 2
    for record in (one, grand):
        assert b"userxattr" not in _mount_options(Path(record.box_workspace))
    copy = Path(grand.box_workspace)
    assert (copy / "sub" / "c.txt").read_text() == "gamma\n" and (copy / "a.txt").read_text() == "alpha\n"
    assert not os.path.lexists(copy / "b.txt") and (copy / "wh").is_file() and not os.path.lexists(copy / "dev0")
    for record in (sibling,):
        assert (Path(record.box_workspace) / "b.txt").read_text() == "beta\n"
    changes = {from_store(c.path): c for c in list_changes(CopyManifest.load(grand.manifest_path))}
    assert changes[b"b.txt"].after is None and str(changes[b"b.txt"].status) == "deleted"
    assert set(changes) == {b"b.txt", b"wh"} | ({b"sub", b"a.txt"} & set(changes))  # metadata at most, never a device
    report = apply_changes(CopyManifest.load(grand.manifest_path))
    assert report.conflicts == [], report.lines()
    ws = tmp_path / "ws"
    assert (
        not os.path.lexists(ws / "b.txt") and (ws / "wh").is_file() and (ws / "sub" / "c.txt").read_text() == "gamma\n"
    )
    for rel, st in _entries(ws).items():
        assert stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode), rel


DEEP = r"""
python3 - <<'PY'
import os
fd = os.open(".", os.O_RDONLY); os.mkdir("chain", dir_fd=fd)
sub = os.open("chain", os.O_RDONLY, dir_fd=fd); os.close(fd); fd = sub
for _ in range(600):
    os.mkdir("d", dir_fd=fd); sub = os.open("d", os.O_RDONLY, dir_fd=fd); os.close(fd); fd = sub
os.mkfifo("fifo", dir_fd=fd)
os.close(os.open("suid", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd)); os.chmod("suid", 0o6755, dir_fd=fd)
PY
echo deep
"""


def _deep_leaf(copy: Path) -> bytes:
    return os.fsencode(copy) + b"/chain" + b"/d" * 600


def _leaf_lstat(copy: Path, name: str) -> os.stat_result | None:
    fd = os.open(os.fsencode(copy) + b"/chain", os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(600):
            sub = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = sub
        try:
            return os.lstat(name, dir_fd=fd)
        except FileNotFoundError:
            return None
    finally:
        os.close(fd)


@pytest.mark.docker
@pytest.mark.parametrize("where", ["copy", "fork"])
def test_a_tree_deeper_than_the_freeze_walks_is_a_typed_error_and_nothing_is_half_frozen(
    tmp_path, monkeypatch, open_sandbox, where
):
    """The box hides a FIFO and a setuid file 600 levels down (deeper than the freeze's walk enters) in a plain
    copy, or in a fork's upper: the fork is refused RESOURCE_EXHAUSTED (never a layer holding them as they
    were), the parent is left mounted and whole, no layer is left behind, and a second try is refused too."""
    from orchestrator.workspace.fork import fork_session
    from orchestrator.workspace.overlay import is_mounted, layers_root
    from orchestrator.workspace.records import open_own_record

    sid = _parent(tmp_path, monkeypatch)
    if where == "fork":
        (first,) = fork_session(sid, 1, box_on_copy=no_box)
        sid = first.id
    target = open_own_record(sid)
    assert "deep" in _in_box(open_sandbox, Path(target.box_workspace), DEEP)
    layers_before = sorted(os.listdir(layers_root()))
    for _ in range(2):
        with pytest.raises(OpenAgentsError) as err:
            fork_session(sid, 1, box_on_copy=no_box)
        assert err.value.type == ErrorType.RESOURCE_EXHAUSTED, err.value
        target = open_own_record(sid)
        copy = Path(target.box_workspace)
        assert (copy / "a.txt").read_text() == "alpha\n"
        leaf = _leaf_lstat(copy, "suid")  # (a FIFO made under gVisor lives in gVisor's kernel alone)
        assert leaf is not None and stat.S_ISREG(leaf.st_mode)  # the parent's own view is as the box left it
        assert sorted(os.listdir(layers_root())) == layers_before
        if where == "fork":
            assert target.cow is not None and is_mounted(copy) and len(target.cow.lowers) == 1
        else:
            assert target.cow is None and not is_mounted(copy)
    listed = {r["id"] for r in json.loads(_oa(tmp_path, "sessions", "--json").stdout) if not r["discarded"]}
    assert len(listed) == (2 if where == "fork" else 1)  # no half-made fork left listed


def _oa(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        XDG_STATE_HOME=str(tmp_path / "state"),
        XDG_CONFIG_HOME=str(tmp_path / "config"),
        PYTHONPATH=str(ROOT),
    )
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args],
        input="",
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )


@pytest.mark.parametrize("state", ["state", "state-" + "s" * 40], ids=["short-state-path", "long-state-path"])
def test_a_chain_of_forks_past_the_layer_cap_stays_whole(tmp_path, monkeypatch, state):
    """A fork of a fork of a fork ..., each writing before it is forked again, 40 deep: no mount ever holds more than
    MAX_LAYERS layers, and past the cap (or past what one page of mount options carries, under a long state path) a fork
    is a data copy, never an error that stops the chain; every fork sees exactly the files written by its ancestors."""
    from orchestrator.workspace.fork import fork_session
    from orchestrator.workspace.overlay import MAX_LAYERS

    sid = _parent(tmp_path, monkeypatch, state)
    chain = [sid]
    copies = 0
    for depth in range(40):
        (fork,) = fork_session(chain[-1], 1, box_on_copy=no_box)
        copy = Path(fork.box_workspace)
        assert sorted(p.name for p in copy.glob("gen*")) == sorted(f"gen{i}" for i in range(depth))
        if fork.cow is None:
            copies += 1
        else:
            assert len(fork.cow.lowers) <= MAX_LAYERS
        (copy / f"gen{depth}").write_text(f"{depth}\n")
        chown_tree(copy)
        chain.append(fork.id)
    assert copies >= 1  # the cap was met and passed


def test_concurrent_forks_of_one_parent_from_two_processes_lose_no_layer(tmp_path, monkeypatch):
    """Two `oa-sandbox fork` processes on one parent that wrote since its last freeze, at once: each either
    makes its forks or is refused typed; every fork made sees the parent's writes and none of another
    fork's, every layer a session stands on exists, and the parent stays mounted with its writes."""
    from orchestrator.workspace.fork import fork_session
    from orchestrator.workspace.overlay import is_mounted
    from orchestrator.workspace.records import open_own_record

    sid = _parent(tmp_path, monkeypatch)
    fork_session(sid, 1, box_on_copy=no_box)  # the parent is an overlay now
    parent = open_own_record(sid)
    (Path(parent.box_workspace) / "since.txt").write_text("written after the first fork\n")
    chown_tree(Path(parent.box_workspace))
    env = dict(
        os.environ,
        XDG_STATE_HOME=str(tmp_path / "state"),
        XDG_CONFIG_HOME=str(tmp_path / "config"),
        PYTHONPATH=str(ROOT),
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", "fork", sid, "-n", "2", "--output", "json"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    made = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=300)
        if proc.returncode == 0:
            made.extend(json.loads(stdout)["forks"])
        else:
            assert proc.returncode == 2 and json.loads(stdout)["error"]["type"] == "invalid_arguments", stderr
    assert made
    parent = open_own_record(sid)
    assert parent.cow is not None and is_mounted(Path(parent.box_workspace))
    assert (Path(parent.box_workspace) / "since.txt").read_text() == "written after the first fork\n"
    for i, fork_id in enumerate(made):
        fork = open_own_record(fork_id)
        assert fork.cow is not None and all(os.path.isdir(layer) for layer in fork.cow.lowers)
        copy = Path(fork.box_workspace)
        assert (copy / "since.txt").read_text() == "written after the first fork\n"
        (copy / f"mine{i}").write_text(f"{i}\n")
    for i, fork_id in enumerate(made):
        copy = Path(open_own_record(fork_id).box_workspace)
        assert sorted(p.name for p in copy.glob("mine*")) == [f"mine{i}"]
    assert not list(Path(parent.box_workspace).glob("mine*"))


def test_a_huge_sparse_file_written_in_a_fork_is_counted_as_it_costs(tmp_path, monkeypatch):
    """A 4 GiB sparse file in the parent, frozen into the layer; one byte written to it through
    a fork copies it up into the fork's upper: what that costs on disk is what the write quota
    counts (the merged view does not grow), and the parent and layer keep it sparse."""
    from orchestrator.sandbox.sweep_journal import capture_baseline
    from orchestrator.workspace.fork import fork_session
    from orchestrator.workspace.overlay import fork_upper
    from orchestrator.workspace.quota import WriteQuota
    from orchestrator.workspace.records import open_own_record

    sid = _parent(tmp_path, monkeypatch)
    parent = open_own_record(sid)
    with open(Path(parent.box_workspace) / "sparse", "wb") as fh:
        fh.truncate(4 << 30)
        fh.write(b"head")
    chown_tree(Path(parent.box_workspace))
    (fork,) = fork_session(sid, 1, box_on_copy=no_box)
    copy = Path(fork.box_workspace)
    upper = fork_upper(copy)
    assert upper is not None
    baseline = capture_baseline(copy)
    quota = WriteQuota(copy, 64 << 20, baseline.usage_bytes, start_entries=baseline.entries, layer=upper)
    with open(copy / "sparse", "r+b") as fh:
        fh.seek(2 << 30)
        fh.write(b"middle")
    used = os.lstat(upper / "sparse").st_blocks * 512
    quota.check()
    assert quota.growth >= used and used < 64 << 20  # holes stay holes in the copy-up, and the copy-up is counted
    layer = Path(open_own_record(sid).cow.lowers[0])
    assert os.lstat(layer / "sparse").st_blocks * 512 < 1 << 20
