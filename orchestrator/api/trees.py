"""Directory trees for Sandbox.upload() and download() (issue 46): one tar archive each way, moved as
one file by the bytes calls (box_files.py) and packed or unpacked in the box by one `shell` call, all
through the session's pipeline. Only directories and regular files move; links, FIFOs and devices are
left out, by name (TreeResult.skipped). What comes back from the box is parsed from memory, bounded by
the read limit, and landed through orchestrator/boxfs (land_tree: no link followed, every file
written atomically); an upload reads this machine's files, never the session's own workspace."""

from __future__ import annotations

import hashlib
import io
import shlex
import tarfile
import tempfile
import uuid
from pathlib import Path
from typing import Any, Iterator

from sandbox_agent.paths import PathRefused, check_lexical

from ..boxfs import HostBudget, land_tree
from ..errors import ErrorType, OpenAgentsError
from .box_files import MAX_FILE, WRITE_BYTES, Transfer
from .results import ToolError, TreeResult

LOCAL_READ = 1 << 20


def _box_dir(tool: str, rel: str) -> str:
    try:
        return check_lexical(rel, mutation=tool == "upload")
    except PathRefused as err:
        try:
            kind = ErrorType(err.kind)
        except ValueError:
            kind = ErrorType.PATH_INVALID
        raise ToolError(kind, f"{tool}: {err}") from None


def upload_tree(self: Any, local: Path, rel: str) -> TreeResult:
    target = _box_dir("upload", rel)
    workspace = getattr(self, "workspace", None)
    if workspace is not None and local.resolve().is_relative_to(Path(workspace).resolve()):
        raise ToolError(
            ErrorType.INVALID_ARGUMENTS, f"upload: {local} is in the session's workspace, the box's already"
        )
    skipped: list[str] = []

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        if not (info.isreg() or info.isdir()):
            skipped.append(info.name[:300])
            return None
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    with tempfile.TemporaryFile(prefix="oa-upload-") as buf:
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            tar.add(local, arcname=".", filter=keep)
            members = tar.getmembers()
        size = buf.tell()
        if size > MAX_FILE:
            raise ToolError(
                ErrorType.FILE_TOO_LARGE, f"upload: {local} makes an archive of {size} bytes; at most {MAX_FILE}"
            )
        buf.seek(0)
        digest = hashlib.sha256()
        while piece := buf.read(LOCAL_READ):
            digest.update(piece)
        buf.seek(0)
        name = f".oa-upload-{uuid.uuid4().hex[:16]}.tar"
        self._transfer(
            WRITE_BYTES, {"path": name, "size": size, "sha256": digest.hexdigest()}, Transfer(source=buf.read)
        )
    unpack = self.shell(
        f"mkdir -p -- {shlex.quote(target)} && tar -xf {shlex.quote(name)} -C {shlex.quote(target)} --no-same-owner "
        f"--no-same-permissions; rc=$?; rm -f -- {shlex.quote(name)}; exit $rc",
        timeout=240,
    )
    if unpack.exit_code != 0:
        raise ToolError(
            ErrorType.IO_ERROR,
            f"upload: unpacking in the box failed (exit {unpack.exit_code}): {unpack.output[-500:]}",
            unpack.result,
        )
    files = [m for m in members if m.isreg()]
    return TreeResult(path=target, files=len(files), bytes=sum(m.size for m in files), skipped=skipped)


def download_tree(self: Any, rel: str, local: Path, limit: int) -> TreeResult:
    source = _box_dir("download", rel)
    name = f".oa-download-{uuid.uuid4().hex[:16]}.tar"
    try:
        packed = self.shell(
            f"test -d {shlex.quote(source)} || {{ echo 'not a directory' >&2; exit 20; }}; "
            f"tar -cf {shlex.quote(name)} --exclude='.oa-download-*.tar' -C {shlex.quote(source)} .",
            timeout=240,
        )
        if packed.exit_code == 20:
            raise ToolError(
                ErrorType.NOT_A_DIRECTORY, f"download: {source} is not a directory or a regular file", packed.result
            )
        if packed.exit_code not in (0, 1):  # 1: a file changed while it was read (it is in the archive as tar found it)
            raise ToolError(
                ErrorType.IO_ERROR,
                f"download: packing in the box failed (exit {packed.exit_code}): {packed.output[-500:]}",
                packed.result,
            )
        data = self.read_bytes(name, limit=limit)
    finally:
        self.shell(f"rm -f -- {shlex.quote(name)}", timeout=30)
    budget = HostBudget(max_bytes=limit, max_entries=200_000)
    skipped: list[str] = []

    def members() -> Iterator[tuple[str, bytes | None, int]]:
        try:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
                for member in tar:
                    path = member.name[2:] if member.name.startswith("./") else member.name
                    if path in ("", "."):
                        continue
                    if member.isdir():
                        yield path.rstrip("/"), None, 0o755
                    elif member.isreg():
                        handle = tar.extractfile(member)
                        yield path, handle.read(member.size) if handle is not None else b"", member.mode
                    else:
                        skipped.append(path[:300])
        except tarfile.TarError as err:
            raise ToolError(ErrorType.PROTOCOL_ERROR, f"download: the box's archive is unreadable: {err}") from None

    try:
        files, written = land_tree(local, members(), budget)
    except ToolError:
        raise
    except OpenAgentsError as err:
        raise ToolError(err.type, f"download: {err.message}") from None
    return TreeResult(path=str(local), files=files, bytes=written, skipped=skipped)
