"""bench/density.py counts an address space once: gVisor's systrap stubs are several processes on one
address space, each reporting that space's whole PSS, and summing them counted a box's memory thrice."""

from __future__ import annotations

import os
import sys
import time

import pytest

from bench.density import _one_per_address_space

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="kcmp and /proc are Linux's")


def test_a_forked_child_is_another_address_space_and_a_repeat_is_not() -> None:
    child = os.fork()
    if child == 0:  # pragma: no cover - the child only waits to be counted
        time.sleep(30)
        os._exit(0)
    try:
        assert _one_per_address_space([os.getpid(), child, os.getpid()]) == [os.getpid(), child]
    finally:
        os.kill(child, 9)
        os.waitpid(child, 0)
