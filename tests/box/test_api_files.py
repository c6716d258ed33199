"""Bytes in and out of the box (issue 46), against real boxes under runc and runsc: read_bytes,
write_bytes, upload and download move any content exactly, in pieces, atomically; each is one call
of the session's pipeline (a deny refuses it, the transcript has it without the data); what the
box planted (a link, a FIFO, a file over the limit) is refused, typed, and a download never follows
a link at its destination."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from orchestrator import AsyncSandbox, ErrorType, Sandbox, ToolError
from orchestrator.api.box_files import CHUNK
from tests.helpers import BOTH_RUNTIMES, make_workspace

pytestmark = [
    pytest.mark.usefixtures("sandbox_image"),
    pytest.mark.parametrize("runtime", BOTH_RUNTIMES, indirect=True),
]


def records(box) -> list[dict]:
    return [json.loads(line) for line in box.transcript_path.read_text().splitlines() if line.strip()]


def test_bytes_round_trip_exactly_in_pieces(tmp_path, runtime):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    data = os.urandom(2 * CHUNK + 12345)  # three pieces, the last a short one
    odd = b"\xef\xbb\xbfBOM kept\r\n\xff\xfe latin-1 \xe9\x00 and a NUL"
    with Sandbox(ws, runtime=runtime) as box:
        written = box.write_bytes("bin/blob.dat", data)
        assert written.bytes == len(data) and written.sha256 == hashlib.sha256(data).hexdigest() and written.created
        assert box.read_bytes("bin/blob.dat") == data
        assert box.shell("sha256sum bin/blob.dat").output.split()[0] == written.sha256
        box.write_bytes("odd.txt", odd)
        assert box.read_bytes("odd.txt") == odd
        read = box.read_file("odd.txt")
        assert read.binary and read.text == "" and "read_bytes" in read.note
        box.write_bytes("empty", b"")
        assert box.read_bytes("empty") == b""
        assert not [n for n in os.listdir(ws / "bin") if "oa-part" in n]
        # the transcript has each call, never its data
        text = box.transcript_path.read_text()
        assert "write_bytes" in text and "read_bytes" in text and len(text) < len(data) // 4


def test_a_50_mib_file_round_trips_through_upload_and_download(tmp_path, runtime):
    ws = make_workspace(tmp_path / "ws", {})
    source = tmp_path / "big.bin"
    source.write_bytes(os.urandom(50 * 1024 * 1024))
    with Sandbox(ws, runtime=runtime) as box:
        up = box.upload(source, "big.bin")
        assert up.bytes == source.stat().st_size
        down = box.download("big.bin", tmp_path / "back.bin")
        assert down.sha256 == up.sha256
    assert (tmp_path / "back.bin").read_bytes() == source.read_bytes()
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".oa-")]


def test_bad_inputs_and_what_the_box_planted_are_typed_errors(tmp_path, runtime):
    ws = make_workspace(tmp_path / "ws", {"f.txt": "1234567890"})
    with Sandbox(ws, runtime=runtime) as box:
        box.shell("ln -s /etc/passwd link; mkfifo fifo; mkdir d; truncate -s 900M huge")
        cases = {
            "link": ErrorType.PATH_OUTSIDE_WORKSPACE,
            "fifo": ErrorType.NOT_REGULAR_FILE,
            "d": ErrorType.IS_DIRECTORY,
            "missing": ErrorType.FILE_NOT_FOUND,
        }
        for name, kind in cases.items():
            with pytest.raises(ToolError) as err:
                box.read_bytes(name)
            assert err.value.type is kind, (name, err.value)
        with pytest.raises(ToolError) as err:
            box.read_bytes("f.txt", limit=5)
        assert err.value.type is ErrorType.FILE_TOO_LARGE and "limit" in err.value.message
        with pytest.raises(ToolError) as err:
            box.write_bytes(".git/x", b"x")
        assert err.value.type is ErrorType.PATH_IN_GIT_DIR
        with pytest.raises(ToolError) as err:
            box.write_bytes("t.txt", "text")
        assert err.value.type is ErrorType.INVALID_ARGUMENTS
        with pytest.raises(ToolError) as err:
            box.write_bytes("d", b"x")
        assert err.value.type is ErrorType.IS_DIRECTORY
        # a download's destination that is a link is replaced, never followed
        target = tmp_path / "host-secret"
        target.write_text("secret")
        (tmp_path / "dest").symlink_to(target)
        box.download("f.txt", tmp_path / "dest")
        assert target.read_text() == "secret" and not (tmp_path / "dest").is_symlink()
        assert (tmp_path / "dest").read_bytes() == b"1234567890"
        with pytest.raises(ToolError) as err:
            box.download("link", tmp_path / "l")
        assert err.value.type is ErrorType.PATH_OUTSIDE_WORKSPACE and not (tmp_path / "l").exists()
        with pytest.raises(ToolError) as err:  # a sparse 900 MiB file over the limit asked for: nothing moves
            box.download("huge", tmp_path / "h", limit=CHUNK)
        assert err.value.type is ErrorType.FILE_TOO_LARGE and not (tmp_path / "h").exists()
        assert not [n for n in os.listdir(tmp_path) if n.startswith(".oa-")]
        over = tmp_path / "over.bin"  # over the 1 GiB a file may be: refused before anything is sent
        with open(over, "wb") as fh:
            fh.truncate((1 << 30) + 1)
        with pytest.raises(ToolError) as err:
            box.upload(over, "over.bin")
        assert err.value.type is ErrorType.FILE_TOO_LARGE
        with pytest.raises(ToolError) as err:
            box.upload(tmp_path / "missing", "m.bin")
        assert err.value.type is ErrorType.FILE_NOT_FOUND


def test_a_deny_refuses_bytes_calls_through_the_one_pipeline(tmp_path, runtime):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a"})
    policy = tmp_path / "deny.toml"
    policy.write_text('[[rules]]\ntool = "write_bytes"\ndecision = "deny"\n')
    with Sandbox(ws, runtime=runtime, policy_files=[policy]) as box:
        with pytest.raises(ToolError) as err:
            box.write_bytes("b.bin", b"\x00\x01")
        assert err.value.type is ErrorType.REFUSED_BY_POLICY
        assert not (ws / "b.bin").exists()
        assert box.read_bytes("a.txt") == b"a"
        names = [r.get("tool") for r in records(box) if r.get("type") == "tool_call"]
        assert "read_bytes" in names and "write_bytes" in names


def test_async_bytes(tmp_path, runtime):
    import asyncio

    ws = make_workspace(tmp_path / "ws", {})

    async def main() -> bytes:
        async with AsyncSandbox(ws, runtime=runtime) as box:
            await box.write_bytes("x.bin", b"\x00" * 10)
            await box.download("x.bin", tmp_path / "x.bin")
            return await box.read_bytes("x.bin")

    assert asyncio.run(main()) == b"\x00" * 10
    assert (tmp_path / "x.bin").read_bytes() == b"\x00" * 10


def test_a_file_the_box_swaps_while_it_is_read_is_never_a_mix(tmp_path, runtime):
    ws = make_workspace(tmp_path / "ws", {})
    a, b = b"a" * (3 * CHUNK), b"b" * (3 * CHUNK)
    with Sandbox(ws, runtime=runtime) as box:
        box.write_bytes("a.bin", a)
        box.write_bytes("b.bin", b)
        box.shell("cp a.bin f.bin")
        swapper = box.start("while true; do cp a.bin t1 && mv t1 f.bin; cp b.bin t2 && mv t2 f.bin; done")
        outcomes = set()
        for _ in range(6):
            try:
                data = box.read_bytes("f.bin")
                assert data in (a, b), "a read mixed two files"
                outcomes.add("whole")
            except ToolError as err:
                assert err.type in (ErrorType.STALE_CONTENT, ErrorType.FILE_NOT_FOUND), err
                outcomes.add(err.type.value)
        swapper.kill()
        assert outcomes


def test_a_directory_tree_uploads_and_downloads(tmp_path, runtime):
    from orchestrator import TreeResult

    ws = make_workspace(tmp_path / "ws", {})
    src = tmp_path / "src"
    (src / "pkg" / "deep").mkdir(parents=True)
    (src / "empty").mkdir()
    (src / "pkg" / "a.py").write_text("print('a')\n")
    (src / "pkg" / "deep" / "blob.bin").write_bytes(os.urandom(3 * CHUNK))
    (src / "link").symlink_to("/etc/passwd")  # left out, by name
    with Sandbox(ws, runtime=runtime) as box:
        up = box.upload(src, "proj")
        assert isinstance(up, TreeResult) and up.files == 2 and up.skipped == ["./link"]
        assert box.read_bytes("proj/pkg/deep/blob.bin") == (src / "pkg" / "deep" / "blob.bin").read_bytes()
        assert box.shell("test -d proj/empty && test ! -e proj/link && echo ok").output == "ok\n"
        # what the box adds comes back as directories and regular files only; its links never land
        box.shell("ln -s /etc/shadow proj/pkg/evil; mkfifo proj/pkg/fifo; echo new > proj/pkg/new.txt")
        down = box.download("proj", tmp_path / "back")
        assert isinstance(down, TreeResult) and down.files == 3 and sorted(down.skipped) == ["pkg/evil", "pkg/fifo"]
        back = tmp_path / "back"
        assert (back / "pkg" / "deep" / "blob.bin").read_bytes() == (src / "pkg" / "deep" / "blob.bin").read_bytes()
        assert (back / "pkg" / "new.txt").read_text() == "new\n" and (back / "empty").is_dir()
        assert not (back / "pkg" / "evil").exists() and not (back / "pkg" / "fifo").exists()
        # a link already at the destination is never followed into
        outside = tmp_path / "outside"
        outside.mkdir()
        dest = tmp_path / "dest"
        dest.mkdir()
        (dest / "pkg").symlink_to(outside)
        with pytest.raises(ToolError) as err:
            box.download("proj", dest)
        assert err.value.type is ErrorType.NOT_A_DIRECTORY and not any(outside.iterdir())
        with pytest.raises(ToolError) as err:
            box.upload(ws, "x")  # the workspace is the box's already
        assert err.value.type is ErrorType.INVALID_ARGUMENTS
        assert not [n for n in os.listdir(ws) if n.startswith(".oa-")]
