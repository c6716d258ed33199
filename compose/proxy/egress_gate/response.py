"""The answer of a host with a credential rule, read the way the box's client will read it.

Blanking bytes on the wire is not enough: a chunk-size line the upstream puts in the middle of an
echoed secret (the box moves that boundary by padding its own header) is gone once the box's client
de-chunks, and a body compressed against our `Accept-Encoding: identity` holds the secret in a form
no byte match sees. So the gate parses the framing itself: the status line and headers (blanked),
the body by its Content-Length, de-chunked, or up to the close; a gzip body (sent although we asked
for identity) decoded; every form of each secret blanked (redact.py) in what the box's client will
decode; then re-framed: an exact Content-Length when the body fits BUFFER_LIMIT, else the gate's own
chunking (HTTP/1.1) or the close (HTTP/1.0). An answer it cannot read that way (a protocol upgrade
or 101, any other content or transfer coding, an HTTP/2 or malformed status line or header, a
Content-Length next to a Transfer-Encoding) is refused before the box gets a byte of it: Uninspectable.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Iterator

from .redact import Redactor

HEAD_LIMIT = 64 * 1024
LINE_LIMIT = 4096  # a chunk-size line with its extensions, a trailer line
BUFFER_LIMIT = 1 << 20  # a body up to this size goes to the box with an exact Content-Length
READ = 65536
_STATUS = re.compile(rb"HTTP/1\.[01] ([1-9][0-9]{2})(?: [\t\x20-\x7e\x80-\xff]*)?\Z")
_FIELD = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")
_SIZE = re.compile(rb"[0-9a-fA-F]{1,15}\Z")
DROPPED = {
    b"connection",
    b"keep-alive",
    b"transfer-encoding",
    b"content-length",
    b"trailer",
    b"upgrade",
    b"proxy-connection",
    b"te",
}


class Uninspectable(Exception):
    """An answer the gate cannot read as the box's client would: refused, nothing of it sent."""


class Upstream:
    """The upstream's bytes through one buffer, counted, with the response cap."""

    def __init__(self, recv: Callable[[int], bytes], cap: int) -> None:
        self.recv, self.cap = recv, cap
        self.buf = b""
        self.received = 0
        self.closed = False

    def fill(self) -> bool:
        if self.closed:
            return False
        try:
            data = self.recv(READ)
        except OSError:  # ssl.SSLError is one; a reset or a TLS close without close_notify ends the body
            data = b""
        if not data:
            self.closed = True
            return False
        self.received += len(data)
        if self.received > self.cap:
            raise Uninspectable(f"the answer is over the cap of {self.cap} bytes")
        self.buf += data
        return True

    def line(self, limit: int) -> bytes:
        while b"\r\n" not in self.buf:
            if len(self.buf) > limit or not self.fill():
                raise Uninspectable("a malformed or cut framing line in the answer")
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def take(self, size: int) -> Iterator[bytes]:
        while size > 0:
            if not self.buf and not self.fill():
                raise Uninspectable("the answer ended before its declared length")
            piece, self.buf = self.buf[:size], self.buf[size:]
            size -= len(piece)
            yield piece

    def rest(self) -> Iterator[bytes]:
        while self.buf or self.fill():
            piece, self.buf = self.buf, b""
            yield piece


def read_head(up: Upstream) -> tuple[int, list[tuple[bytes, bytes]]]:
    """The final status and headers (interim 1xx answers other than 101 are read and dropped)."""
    while True:
        while b"\r\n\r\n" not in up.buf:
            if len(up.buf) > HEAD_LIMIT or not up.fill():
                raise Uninspectable(
                    "no complete HTTP/1.1 status line and headers (HTTP/2, or a malformed or cut answer)"
                )
        head, up.buf = up.buf.split(b"\r\n\r\n", 1)
        lines = head.split(b"\r\n")
        status = _STATUS.match(lines[0])
        if status is None or any(b"\n" in line or b"\r" in line or b"\0" in line for line in lines):
            raise Uninspectable("a malformed status line or header (HTTP/2, or bytes a client may split elsewhere)")
        headers = []
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep or not _FIELD.match(name):
                raise Uninspectable("a malformed header line in the answer")
            headers.append((name, value.strip(b" \t")))
        code = int(status.group(1))
        if code == 101:
            raise Uninspectable("a protocol upgrade (101): the gate cannot inspect what follows")
        if code >= 200:
            return code, headers


def _values(headers: list[tuple[bytes, bytes]], name: bytes) -> list[bytes]:
    return [v.strip().lower() for k, v in headers if k.lower() == name for v in v.split(b",") if v.strip()]


def body_pieces(
    up: Upstream, method: str, code: int, headers: list[tuple[bytes, bytes]]
) -> tuple[Iterator[bytes], bool]:
    """The body as the box's client would decode it, in pieces, and whether it was gzip-decoded."""
    transfer = _values(headers, b"transfer-encoding")
    lengths = {v.strip() for k, v in headers if k.lower() == b"content-length" for v in v.split(b",")}
    coding = [c for c in _values(headers, b"content-encoding") if c != b"identity"]
    if coding not in ([], [b"gzip"], [b"x-gzip"]):
        raise Uninspectable(
            f"Content-Encoding {b', '.join(coding).decode('latin-1')[:60]!r} "
            "(the gate asked for identity and reads only gzip)"
        )
    if method == "HEAD" or code in (204, 304):
        return iter(()), bool(coding)
    if transfer:
        if transfer != [b"chunked"]:
            raise Uninspectable(
                f"Transfer-Encoding {b', '.join(transfer).decode('latin-1')[:60]!r} (only chunked is read)"
            )
        if lengths:
            raise Uninspectable("both Transfer-Encoding and Content-Length in the answer")
        pieces = _dechunk(up)
    elif lengths:
        if len(lengths) != 1 or not re.fullmatch(rb"[0-9]{1,18}", next(iter(lengths))):
            raise Uninspectable("a malformed or conflicting Content-Length in the answer")
        pieces = up.take(int(next(iter(lengths))))
    else:
        pieces = up.rest()
    return (_gunzip(pieces, up.cap) if coding else pieces), bool(coding)


def _dechunk(up: Upstream) -> Iterator[bytes]:
    while True:
        size_text = up.line(LINE_LIMIT).split(b";", 1)[0].strip(b" \t")
        if not _SIZE.match(size_text):
            raise Uninspectable("a malformed chunk size in the answer")
        size = int(size_text, 16)
        if size == 0:
            while up.line(LINE_LIMIT):  # trailer fields: read and dropped
                pass
            return
        yield from up.take(size)
        if up.line(2) != b"":
            raise Uninspectable("a chunk not followed by CRLF in the answer")


def _gunzip(pieces: Iterator[bytes], cap: int) -> Iterator[bytes]:
    """gzip decoded, at most `cap` bytes out in all (a small body that inflates hugely is refused)."""
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = 0
    try:
        for piece in pieces:
            data = piece
            while data:
                if inflate.eof:  # a second member (or bytes after the end): what a client decodes is not what was read
                    raise Uninspectable("a gzip body of more than one member, or data after its end")
                chunk = inflate.decompress(data, READ)
                data = inflate.unconsumed_tail or inflate.unused_data
                out += len(chunk)
                if out > cap:
                    raise Uninspectable(f"the decoded answer is over the cap of {cap} bytes")
                yield chunk
        if not inflate.eof:
            raise Uninspectable("a cut gzip body")
    except zlib.error:
        raise Uninspectable("a malformed gzip body") from None


def relay(up: Upstream, send: Callable[[bytes], None], redactor: Redactor, method: str, chunked_ok: bool) -> None:
    """Reads the answer, blanks it and sends it to the box re-framed. Uninspectable before the box
    has any of it when the head or the first BUFFER_LIMIT bytes cannot be read; later, the box's
    connection is just cut (no last chunk: its client sees the answer is incomplete)."""
    code, headers = read_head(up)
    pieces, decoded = body_pieces(up, method, code, headers)
    kept = [
        (redactor.blank(k), redactor.blank(v))
        for k, v in headers
        if k.lower() not in DROPPED and not (decoded and k.lower() == b"content-encoding")
    ]
    no_body = method == "HEAD" or code in (204, 304)
    if no_body and not decoded:  # the length the body would have: the box's client reads none
        kept += [(k, v) for k, v in headers if k.lower() == b"content-length"][:1]
    status = up_status(code)
    held = b""
    for piece in pieces:
        held += redactor.feed(piece)
        if len(held) > BUFFER_LIMIT:
            break
    else:
        held += redactor.feed(b"", final=True)
        framing = [] if no_body else [(b"Content-Length", str(len(held)).encode())]
        send(_head(status, kept + framing) + held)
        return
    framing = [(b"Transfer-Encoding", b"chunked")] if chunked_ok else []
    send(_head(status, kept + framing))
    frame = (lambda data: b"%x\r\n%s\r\n" % (len(data), data) if data else b"") if chunked_ok else (lambda data: data)
    send(frame(held))
    for piece in pieces:
        send(frame(redactor.feed(piece)))
    send(frame(redactor.feed(b"", final=True)) + (b"0\r\n\r\n" if chunked_ok else b""))


def up_status(code: int) -> bytes:
    return b"HTTP/1.1 %d %s" % (code, _REASONS.get(code, b"Status"))


def _head(status: bytes, headers: list[tuple[bytes, bytes]]) -> bytes:
    return status + b"\r\n" + b"".join(k + b": " + v + b"\r\n" for k, v in headers) + b"Connection: close\r\n\r\n"


_REASONS = {
    200: b"OK",
    201: b"Created",
    202: b"Accepted",
    204: b"No Content",
    206: b"Partial Content",
    301: b"Moved Permanently",
    302: b"Found",
    303: b"See Other",
    304: b"Not Modified",
    307: b"Temporary Redirect",
    308: b"Permanent Redirect",
    400: b"Bad Request",
    401: b"Unauthorized",
    403: b"Forbidden",
    404: b"Not Found",
    409: b"Conflict",
    422: b"Unprocessable Content",
    429: b"Too Many Requests",
    500: b"Internal Server Error",
    502: b"Bad Gateway",
    503: b"Service Unavailable",
}
