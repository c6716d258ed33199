"""What tests/attacks/test_boxfs.py shares with other tests, kept here
(issue 48: helpers in one place, none imported from a test module)."""

from __future__ import annotations

import os
from pathlib import Path

HOSTILE_NAMES = [
    b"new\nline",
    b"bad\xffutf8",
    b"esc\x1b[2Jclear",
    b"tab\tname",
    b"back\\slash",
    b"\xc3\x28",
    "ünï".encode(),
]


def deep_chain(root: Path, depth: int) -> None:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            sub = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = sub
        os.close(os.open("leaf", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd))
    finally:
        os.close(fd)
