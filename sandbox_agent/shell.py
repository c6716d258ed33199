"""``shell``: /bin/sh -c with no standard input, a clamped timeout, capped output, and no survivors.

Nothing started by a command outlives its call: when the agent is the container's PID 1 it
sends SIGKILL to every other process it may signal (``kill(-1)``), which reaches children that
called setsid or daemonized. The host does the same from outside if the agent does not answer.
"""
from __future__ import annotations

import codecs
import os
import re
import select
import signal
import subprocess
import threading
import time
from typing import Callable

from . import limits
from .paths import WORKSPACE
from .tools import ToolError, _arg

# Variables that may carry credentials are never handed to the child, even if one reached the box.
# The host's transcript redactor uses the same pattern.
SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIAL|GRANT|AUTH)", re.I)

_lock = threading.Lock()
STREAM_EVERY_S = 0.2  # output chunks are coalesced: at most one message per interval
STREAM_CHUNK_CHARS = 4096  # and each bounded: a live tail, never the whole output (the result has that)


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not SECRET_NAME.search(k)}
    env.setdefault("HOME", "/tmp")
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    return env


class _CappedReader(threading.Thread):
    """Keeps the head and the tail of the stream; memory stays bounded whatever the command prints."""

    def __init__(self, stream, on_output: Callable[[str], None] | None = None) -> None:
        super().__init__(daemon=True)
        self.stream = stream
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0
        self.on_output = on_output
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._unsent = ""
        self._last_sent = 0.0

    def _stream(self, chunk: bytes, final: bool = False, flush: bool = False) -> None:
        """Hand the caller the newest output, coalesced and bounded (its tail when there is more)."""
        if self.on_output is None:
            return
        self._unsent = (self._unsent + self._decoder.decode(chunk, final))[-STREAM_CHUNK_CHARS:]
        now = time.monotonic()
        if self._unsent and (final or flush or now - self._last_sent >= STREAM_EVERY_S):
            text, self._unsent, self._last_sent = self._unsent, "", now
            try:
                self.on_output(text)
            except Exception:  # noqa: BLE001 - the live view must never break the command's result
                self.on_output = None

    def run(self) -> None:
        head_cap, tail_cap = limits.SHELL_OUTPUT_HEAD_BYTES, limits.SHELL_OUTPUT_TAIL_BYTES
        while True:
            if self._unsent and self.on_output is not None:  # output waiting: send it if nothing follows soon
                try:
                    ready, _, _ = select.select([self.stream.fileno()], [], [], STREAM_EVERY_S)
                except (OSError, ValueError):
                    ready = [True]
                if not ready:
                    self._stream(b"", flush=True)
                    continue
            try:
                chunk = os.read(self.stream.fileno(), 65536)
            except OSError:
                break
            if not chunk:
                break
            self._stream(chunk)
            self.total += len(chunk)
            room = head_cap - len(self.head)
            if room > 0:
                self.head += chunk[:room]
                chunk = chunk[room:]
            if chunk:
                self.tail += chunk
                if len(self.tail) > tail_cap:
                    del self.tail[: len(self.tail) - tail_cap]
        self._stream(b"", final=True)

    def text(self) -> tuple[str, bool]:
        truncated = self.total > len(self.head) + len(self.tail)
        body = bytes(self.head)
        if truncated:
            skipped = self.total - len(self.head) - len(self.tail)
            body += f"\n[... {skipped} bytes of output omitted ...]\n".encode()
        body += bytes(self.tail)
        return body.decode("utf-8", errors="replace"), truncated


def _kill_everything_else(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    if os.getpid() != 1:
        return
    # As PID 1 we see every process in the box: SIGKILL them all (setsid'd and double-forked ones
    # too) until none is left, reaping the orphans that were reparented to us. Repeat, because a
    # process that was forking during one kill(-1) can escape that one.
    proc.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            break
        except OSError:
            pass
        _reap()
        time.sleep(0.005)
    _reap()


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def shell(args: dict, on_output: Callable[[str], None] | None = None) -> dict:
    """`on_output(text)`, if given, receives the output while the command runs (see _CappedReader)."""
    command = _arg(args, "command", str, required=True)
    requested = _arg(args, "timeout", int, limits.SHELL_DEFAULT_TIMEOUT_S)
    if requested < 1:
        raise ToolError("invalid_arguments", "timeout must be at least 1 second")
    timeout = min(requested, limits.SHELL_MAX_TIMEOUT_S)
    with _lock:
        started = time.monotonic()
        try:
            proc = subprocess.Popen(
                ["/bin/sh", "-c", command],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                cwd=WORKSPACE if os.path.isdir(WORKSPACE) else None,
                env=child_env(),
                start_new_session=True,
                close_fds=True,
            )
        except OSError as err:
            raise ToolError("io_error", f"could not start /bin/sh: {err.strerror}") from None
        reader = _CappedReader(proc.stdout, on_output)
        reader.start()
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        _kill_everything_else(proc)
        proc.wait()
        reader.join(timeout=2)
        proc.stdout.close()
        elapsed = time.monotonic() - started
    output, truncated = reader.text()
    meta = {
        "exit_code": None if timed_out else proc.returncode,
        "timed_out": timed_out,
        "timeout_s": timeout,
        "requested_timeout_s": requested,
        "clamped": requested != timeout,
        "output_bytes": reader.total,
        "output_truncated": truncated,
        "output_cap_bytes": limits.SHELL_OUTPUT_HEAD_BYTES + limits.SHELL_OUTPUT_TAIL_BYTES,
        "elapsed_s": round(elapsed, 3),
    }
    notes = []
    if requested != timeout:
        notes.append(f"[timeout {requested}s was clamped to the {limits.SHELL_MAX_TIMEOUT_S}s ceiling]")
    if truncated:
        notes.append(f"[output was {reader.total} bytes; only the first and last {meta['output_cap_bytes']} bytes are kept]")
    if timed_out:
        notes.append(f"[timed out after {timeout}s; the command and everything it started were killed]")
        raise ToolError("timeout", "\n".join(notes), output=output, meta=meta)
    notes.append(f"[exit code {proc.returncode}]")
    return {"output": output, "note": "\n".join(notes), "meta": meta}

