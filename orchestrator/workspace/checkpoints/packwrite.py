"""Objects written straight into one pack (format v2 and its index v2), with the standard library.

A record that walks a workspace it never saw (the session's turn 0, a new process's first record)
makes thousands of objects. Written loose, each costs a compression, a file and a 4 KiB block, then
packing reads them all back, searches deltas and compresses them again (issue 50: 77 s for a
42k-file tree). Here each object is hashed and compressed once, appended to one pack file, and the
index is written at the end: no loose file, no read-back, no delta search. Later small records keep
the loose objects and the delta search (objects.py), which are cheap for a few files.

The pack is written under a temporary name in the store's own pack directory (ours, never the
box's) and only becomes visible to libgit2 when its index is renamed into place, last.
"""

from __future__ import annotations

import hashlib
import os
import struct
import tempfile
import zlib
from pathlib import Path

import pygit2

OBJ_COMMIT, OBJ_TREE, OBJ_BLOB = 1, 2, 3
_TYPE_NAMES = {OBJ_COMMIT: b"commit", OBJ_TREE: b"tree", OBJ_BLOB: b"blob"}
LEVEL = 1  # zlib's fastest: most of the cost of a first record is compression, and level 6 saves ~10% more bytes
_HEADER = struct.Struct(">4sII")


def object_id(kind: int, data: bytes) -> bytes:
    """The git object id (SHA-1) of `data` as an object of `kind`: 20 raw bytes."""
    h = hashlib.sha1(b"%s %d\0" % (_TYPE_NAMES[kind], len(data)))
    h.update(data)
    return h.digest()


def _entry_header(kind: int, size: int) -> bytes:
    out = bytearray()
    byte = (kind << 4) | (size & 0x0F)
    size >>= 4
    while size:
        out.append(byte | 0x80)
        byte = size & 0x7F
        size >>= 7
    out.append(byte)
    return bytes(out)


class PackWriter:
    """One pack being written into `pack_dir`. add() returns the object's id; finish() writes the
    index and returns the pack's path (None when nothing was added); abort() removes it all."""

    def __init__(self, pack_dir: Path) -> None:
        self.pack_dir = Path(pack_dir)
        self.pack_dir.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix="tmp_pack_", dir=self.pack_dir)
        self._tmp = Path(name)
        self._fh = os.fdopen(fd, "wb", buffering=1 << 20)
        self._fh.write(_HEADER.pack(b"PACK", 2, 0))  # the count is set by finish()
        self._offset = _HEADER.size
        self._entries: dict[bytes, tuple[int, int]] = {}  # oid -> (offset, crc32)
        self.written = 0  # bytes of the pack so far

    def __contains__(self, oid: bytes) -> bool:
        return oid in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, kind: int, data: bytes, oid: bytes | None = None) -> bytes:
        """The object `data` of `kind` into the pack (once: an id already in it is not written again)."""
        if oid is None:
            oid = object_id(kind, data)
        if oid in self._entries:
            return oid
        packed = _entry_header(kind, len(data)) + zlib.compress(data, LEVEL)
        self._fh.write(packed)
        self._entries[oid] = (self._offset, zlib.crc32(packed))
        self._offset += len(packed)
        self.written = self._offset
        return oid

    def finish(self) -> Path | None:
        """The pack's count and checksum, then its index; both renamed into place, the index last.
        None: nothing was added, or the very same pack is there already."""
        self._fh.flush()
        if not self._entries:
            self.abort()
            return None
        self._fh.seek(0)
        self._fh.write(_HEADER.pack(b"PACK", 2, len(self._entries)))
        self._fh.flush()
        self._fh.close()
        h = hashlib.sha1()
        with open(self._tmp, "rb") as fh:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
        pack_sum = h.digest()
        with open(self._tmp, "ab") as fh:
            fh.write(pack_sum)
            fh.flush()
            os.fsync(fh.fileno())
        base = self.pack_dir / f"pack-{pack_sum.hex()}"
        if base.with_suffix(".idx").exists():  # the same objects in the same order: already there, and not ours to drop
            self.abort()
            return None
        idx_tmp = self._tmp.with_name(self._tmp.name + "_idx")
        with open(idx_tmp, "wb") as fh:
            fh.write(self._index(pack_sum))
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(self._tmp, 0o444)
        os.chmod(idx_tmp, 0o444)
        os.replace(self._tmp, base.with_suffix(".pack"))
        os.replace(idx_tmp, base.with_suffix(".idx"))  # libgit2 finds a pack by its index: last
        return base.with_suffix(".pack")

    def _index(self, pack_sum: bytes) -> bytes:
        oids = sorted(self._entries)
        fanout = [0] * 256
        for oid in oids:
            fanout[oid[0]] += 1
        total = 0
        for i in range(256):
            total += fanout[i]
            fanout[i] = total
        offsets, large = bytearray(), bytearray()
        for oid in oids:
            offset = self._entries[oid][0]
            if offset < 0x80000000:
                offsets += struct.pack(">I", offset)
            else:
                offsets += struct.pack(">I", 0x80000000 | (len(large) // 8))
                large += struct.pack(">Q", offset)
        body = b"".join(
            [
                b"\377tOc",
                struct.pack(">I", 2),
                struct.pack(">256I", *fanout),
                *oids,
                b"".join(struct.pack(">I", self._entries[oid][1]) for oid in oids),
                bytes(offsets),
                bytes(large),
                pack_sum,
            ]
        )
        return body + hashlib.sha1(body).digest()

    def abort(self) -> None:
        try:
            self._fh.close()
        except OSError:
            pass
        for path in (self._tmp, self._tmp.with_name(self._tmp.name + "_idx")):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


def tree_data(entries: list[tuple[str, int, pygit2.Oid]]) -> bytes:
    """A tree object's bytes from (name in to_store form, git mode, id), in git's order (a
    directory's name sorts as if it ended in '/')."""
    encoded = [(name.encode("utf-8", "surrogateescape"), mode, oid) for name, mode, oid in entries]
    encoded.sort(key=lambda e: e[0] + b"/" if e[1] == 0o040000 else e[0])
    return b"".join(b"%o %s\0%s" % (mode, name, oid.raw) for name, mode, oid in encoded)
