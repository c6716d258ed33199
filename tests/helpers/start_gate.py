"""What tests/box/test_start_gate.py shares with other tests, kept here
(issue 48: helpers in one place, none imported from a test module)."""

from __future__ import annotations

import time

WAIT_S = 30.0  # an upper bound for a thread to reach a state, never a timing target


def wait_until(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.005)
