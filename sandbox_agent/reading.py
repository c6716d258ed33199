"""read_file: a bounded window of a text file, and the whole file's sha256."""

from __future__ import annotations

import os

from . import limits
from .paths import resolve
from .sniff import BOM, SNIFF_BYTES, _legacy_guess, _looks_binary, _wide_encoding, cut_at_end
from .tools import READ_CHUNK, ToolError, _arg, _open_regular, _os_error, _path_arg, _refuse_trailing_slash, _sha256

TYPE_CHECKING = False  # not typing's: importing typing costs the agent's start 10-25 ms
if TYPE_CHECKING:
    from typing import Any


def read_file(args: dict[str, Any]) -> dict[str, Any]:
    """Streams the file: memory stays bounded by the 48 KiB cap whatever the file's size, while the
    sha256 still covers the whole file (the stale-content guard needs it)."""
    rel = _path_arg(args)
    offset = _arg(args, "offset", int, 1)
    limit = _arg(args, "limit", int, limits.READ_DEFAULT_LIMIT_LINES)
    if offset < 1 or limit < 1:
        raise ToolError("invalid_arguments", "offset and limit must be at least 1")
    cap = limits.READ_CAP_BYTES
    real = resolve(rel)
    _refuse_trailing_slash(rel, real)
    fd = _open_regular(rel, real)
    try:
        head = os.pread(fd, SNIFF_BYTES, 0)
        size_on_disk = os.fstat(fd).st_size
    except OSError as err:
        os.close(fd)
        raise _os_error(err, rel) from None
    encoding = _wide_encoding(head)  # a character cut at the end is judged on the whole file (_read_special)
    has_bom = head.startswith(BOM)
    binary = _looks_binary(head)
    if encoding or binary:
        try:
            special = _read_special(rel, os.dup(fd), encoding, size_on_disk, offset, limit, binary)
            if special is not None:
                os.close(fd)
                return special
            os.lseek(fd, 0, os.SEEK_SET)  # its byte-order mark was only a hint: read as ordinary text
        except BaseException:
            os.close(fd)
            raise
    digest = _sha256()
    collected: list[bytes] = []
    size = line_no = 0
    end = offset - 1
    full = cut_line = False
    starts_line = first = True
    try:
        with os.fdopen(fd, "rb") as fh:
            while piece := fh.readline(READ_CHUNK):
                digest.update(piece)
                if first:
                    first = False
                    piece = piece[len(BOM) :] if piece.startswith(BOM) else piece
                if starts_line:
                    line_no += 1
                is_start, starts_line = starts_line, piece.endswith(b"\n")
                if full or not is_start or not offset <= line_no < offset + limit:
                    continue
                if size + len(piece) <= cap:
                    collected.append(piece)
                    size += len(piece)
                    end = line_no
                    continue
                if not collected:  # one line longer than the cap: give its first 48 KiB
                    collected.append(piece[:cap])
                    end = line_no
                    cut_line = True
                full = True
    except OSError as err:
        raise _os_error(err, rel) from None
    total = line_no
    if offset > max(total, 1):
        raise ToolError("invalid_arguments", f"offset {offset} is past the end ({total} lines)")
    raw = b"".join(collected)
    if b"\x00" in raw:  # past the 8 KiB sniff: still binary, still not for the model's context
        nul_line = offset + raw[: raw.index(b"\x00")].count(b"\n")
        return _binary_result(rel, size_on_disk, digest.hexdigest(), f"a NUL byte at line {nul_line}")
    try:
        content = raw.decode("utf-8")
        invalid = False
    except UnicodeDecodeError as err:
        # A cut line may end inside a character: that is ours, not the file's.
        invalid = not (cut_line and err.start >= len(raw) - 3)
        content = raw.decode("utf-8", errors="replace" if invalid else "ignore")
    hexdigest = digest.hexdigest()
    truncated = end < total
    meta = {
        "sha256": hexdigest,
        "total_lines": total,
        "first_line": offset,
        "last_line": end,
        "truncated": truncated or cut_line,
        "next_offset": end + 1 if truncated else None,
        "bytes": len(content.encode("utf-8")),
    }
    note = f"[file {rel}: lines {offset}-{end} of {total}; sha256 {hexdigest}]"
    if truncated:
        note += (
            f"\n[truncated at {cap // 1024} KiB or {limit} lines: read on from line {end + 1} with offset={end + 1}]"
        )
    if cut_line:
        note += f"\n[line {end} is longer than {cap} bytes and was cut]"
    if has_bom:
        meta["bom"] = True
        note += "\n" + BOM_NOTE
    if invalid:
        codec, label = _legacy_guess(raw)
        meta["invalid_utf8"] = True
        meta["encoding_guess"] = codec
        note += (
            f"\n[the file is not valid UTF-8 (its bytes look like {label}): bytes that are not UTF-8 show as U+FFFD; "
            f"to see them decoded: `iconv -f {codec} -t utf-8 {rel} | head`; edit_file cannot edit it]"
        )
    return {"output": content, "note": note, "meta": meta}


BOM_NOTE = "[the file starts with a UTF-8 byte-order mark (not shown in the output); write_file and edit_file keep it]"


def _binary_result(rel: str, size: int, hexdigest: str, why: str = "") -> dict[str, Any]:
    return {
        "output": f"[binary file {rel}: {size} bytes, sha256 {hexdigest}; not shown]",
        "note": (f"[{why}] " if why else "")
        + "[binary content (or text in an encoding other than UTF-8) is not shown; use "
        "shell tools to inspect it, e.g. `file`, `od -c | head`, or `iconv -f latin1 -t utf-8 FILE | head`]",
        "meta": {"sha256": hexdigest, "bytes": size, "binary": True, "total_lines": 0, "truncated": False},
    }


def _read_special(
    rel: str, fd: int, encoding: tuple[str, str, int] | None, size: int, offset: int, limit: int, binary: bool
) -> dict[str, Any] | None:
    """A binary file is described, never shown (garbage in the model's context helps nobody);
    UTF-16/32 text is decoded, so the model reads the text and not every other byte as NUL.
    A byte-order mark is a hint: a body that is not strictly its encoding is judged by the ordinary
    rules (`binary`, from the first bytes): None when they say text (the caller reads it as such),
    binary unless the only fault is a character cut at the end (UTF-16 text with an odd trailing
    byte: shown, with U+FFFD and a note)."""
    digest = _sha256()
    kept = bytearray()
    cap = limits.EDIT_MAX_FILE_BYTES
    try:
        with os.fdopen(fd, "rb") as fh:
            while chunk := fh.read(READ_CHUNK):
                digest.update(chunk)
                if encoding and len(kept) <= cap:
                    kept += chunk
    except OSError as err:
        raise _os_error(err, rel) from None
    hexdigest = digest.hexdigest()
    if encoding is None:
        return _binary_result(rel, size, hexdigest)
    codec, label, bom_len = encoding
    if len(kept) > cap:
        raise ToolError("file_too_large", f"{rel} is {label} text of {size} bytes; read_file decodes at most {cap}")
    body = bytes(kept[bom_len:])
    try:
        text, bad = body.decode(codec), ""
    except UnicodeDecodeError as err:
        if not binary:
            return None
        if not cut_at_end(err, len(body)):
            return _binary_result(
                rel,
                size,
                hexdigest,
                f"it starts with a {label} byte-order mark but is not "
                f"{label} text ({err.reason} at byte {err.start + bom_len})",
            )
        # The file's fault, not the arguments': shown with replacement, and said.
        text = body.decode(codec, errors="replace")
        bad = (
            f"\n[the file is not valid {label} ({err.reason} at byte {err.start + bom_len}): "
            "what cannot be decoded shows as U+FFFD; edit_file cannot edit it]"
        )
    lines = text.splitlines(keepends=True)
    total = len(lines)
    if offset > max(total, 1):
        raise ToolError("invalid_arguments", f"offset {offset} is past the end ({total} lines)")
    chosen: list[str] = []
    used = 0
    for line in lines[offset - 1 : offset - 1 + limit]:
        encoded = len(line.encode("utf-8", errors="surrogatepass"))
        if used + encoded > limits.READ_CAP_BYTES and chosen:
            break
        chosen.append(line)
        used += encoded
    end = offset - 1 + len(chosen)
    truncated = end < total
    note = (
        f"[file {rel}: lines {offset}-{end} of {total}; decoded from {label} (it has a byte-order "
        f"mark; write_file and edit_file keep it and the encoding); sha256 {hexdigest}]"
    )
    if truncated:
        note += f"\n[truncated: read on from line {end + 1} with offset={end + 1}]"
    meta = {
        "sha256": hexdigest,
        "total_lines": total,
        "first_line": offset,
        "last_line": end,
        "truncated": truncated,
        "next_offset": end + 1 if truncated else None,
        "bytes": used,
        "encoding": codec,
        "bom": True,
    }
    if bad:
        note += bad
        meta["invalid_encoding"] = True
    return {"output": "".join(chosen), "note": note, "meta": meta}
