"""What a long-lived host (an `acp` server, the soak in bench/soak.py) keeps of boxes it is done
with: no descriptor after a box is closed or replaced, and no freed large buffer held in the
allocator's per-thread arenas (orchestrator/host_memory.py)."""

from __future__ import annotations

import gc
import os
import threading

import pytest

from orchestrator.config import SandboxConfig
from tests.helpers import make_workspace

pytestmark = pytest.mark.docker


def open_fds() -> dict[str, str]:
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            out[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass
    return out


def test_a_closed_or_replaced_box_leaves_no_descriptor_behind(sandbox_image, docker_client, tmp_path):
    """The attach socket sits in a reference cycle in docker-py: closed by us, not by a later garbage
    collection (which is switched off here, as it would not have run yet in a quiet server)."""
    from orchestrator.sandbox.docker import DockerSandbox

    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    docker_client.containers.list()  # the client's own connection, open before we count
    gc.collect()
    gc.disable()
    try:
        before = open_fds()
        box = DockerSandbox(ws, SandboxConfig(), client=docker_client)
        box.start()
        box.call("shell", {"command": "kill 1; sleep 5"})  # the box is replaced: a second attach socket
        assert box.call("read_file", {"path": "a.txt"}).output == "a\n" and box.restarts == 1
        box.close()
        for (
            adapter
        ) in docker_client.api.adapters.values():  # docker-py's idle API connections: a bounded cache, not ours
            adapter.pools.clear()
        left = {fd: target for fd, target in open_fds().items() if fd not in before}
    finally:
        gc.enable()
    assert left == {}, f"descriptors left after the box was closed: {left}"


def test_large_writes_from_many_threads_leave_no_freed_heap_behind(sandbox_image, docker_client, tmp_path):
    """Four threads each writing 1 MiB files: without the fixed mmap threshold each thread's arena
    kept ~4 MiB it had freed (18 MiB for four, measured); with it, the freed heap stays flat."""
    from orchestrator.host_memory import malloc_stats, tune_allocator
    from orchestrator.sandbox.docker import DockerSandbox

    if malloc_stats() is None:
        pytest.skip("not glibc >= 2.33: no mallinfo2 to read the heap with")
    assert tune_allocator(), "glibc did not take M_MMAP_THRESHOLD and M_ARENA_MAX"
    boxes = [
        DockerSandbox(make_workspace(tmp_path / f"ws{n}"), SandboxConfig(), client=docker_client) for n in range(4)
    ]
    for box in boxes:
        box.start()
    try:

        def write(box) -> None:
            for n in range(3):
                assert box.call("write_file", {"path": f"m{n}.txt", "content": "m" * (1 << 20)}).ok

        free_before = _free_held()
        threads = [threading.Thread(target=write, args=(box,)) for box in boxes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        held = (_free_held() - free_before) / (1 << 20)
    finally:
        for box in boxes:
            box.close()
    assert held < 4, f"{held:.1f} MiB of freed heap kept after 12 writes of 1 MiB from 4 threads"


def _free_held() -> int:
    from orchestrator.host_memory import malloc_stats

    stats = malloc_stats()
    assert stats is not None
    return stats[1]


def _rss_kib() -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))


def test_free_heap_left_by_a_peak_goes_back_to_the_system_after_a_call(monkeypatch):
    """A peak of small blocks, half freed, holes everywhere: the pages stay resident until
    release_free_memory (called after every tool call, acting at most every TRIM_EVERY_S) trims."""
    from orchestrator import host_memory

    if host_memory.malloc_stats() is None:
        pytest.skip("not glibc >= 2.33")
    monkeypatch.setattr(host_memory, "_trimmed_at", 0.0)
    peak = [bytearray(64 * 1024) for _ in range(1600)]  # 100 MiB under the mmap threshold: heap, not mappings
    del peak[::2]
    before = _rss_kib()
    assert host_memory.release_free_memory()
    after = _rss_kib()
    assert before - after > 30 * 1024, f"RSS {before} -> {after} KiB"
    assert not host_memory.release_free_memory()  # not again within TRIM_EVERY_S
    del peak


def test_the_process_trims_when_its_last_running_call_ends(monkeypatch):
    """While calls overlap, no more than every TRIM_EVERY_S; when the last one ends, at once (at most
    every IDLE_TRIM_EVERY_S): an idle server's RSS does not keep the peak of its last burst."""
    import time

    from orchestrator import host_memory

    trims: list[int] = []
    monkeypatch.setattr(host_memory, "_trim", lambda pad: trims.append(pad) or 1)
    monkeypatch.setattr(host_memory, "_trimmed_at", time.monotonic() - 2 * host_memory.IDLE_TRIM_EVERY_S)
    with host_memory.tool_call():
        with host_memory.tool_call():
            pass
        assert trims == []  # one call still runs, and TRIM_EVERY_S has not passed
    assert trims == [0]  # the last call ended
    with host_memory.tool_call():
        pass
    assert trims == [0]  # idle again, but within IDLE_TRIM_EVERY_S of the last trim


def test_an_idle_channel_keeps_no_buffer_of_its_last_large_read():
    """Eight channels that each read two 1.1 MiB chunks of lines and then wait: before, each kept
    about 1 MiB (its last chunk, and its line buffer's capacity) for as long as its box lived, which
    was most of the soak's growth over its baseline."""
    import time as _time

    from orchestrator.host_memory import malloc_stats
    from orchestrator.sandbox.channel import Channel

    if malloc_stats() is None:
        pytest.skip("not glibc >= 2.33")

    class Feed:
        def __init__(self) -> None:
            self.chunks = [b'{"v":1,"id":999,"ack":true}\n' * 40000 for _ in range(2)]
            self.idle, self.gate = threading.Event(), threading.Event()

        def recv(self, size: int) -> bytes:
            if self.chunks:
                return self.chunks.pop()
            self.idle.set()
            self.gate.wait()
            return b""

        def sendall(self, data: bytes) -> None:
            pass

        def close(self) -> None:
            self.gate.set()

        def stderr_tail(self) -> bytes:
            return b""

    before = malloc_stats()[0]
    feeds = [Feed() for _ in range(8)]
    channels = [Channel(feed) for feed in feeds]
    try:
        for feed in feeds:
            assert feed.idle.wait(30)
        _time.sleep(0.2)
        held = (malloc_stats()[0] - before) / (1 << 20)
    finally:
        for feed in feeds:
            feed.close()
    assert all(channel.broken is None or channel.broken.type.value == "agent_lost" for channel in channels)
    assert held < 2, f"{held:.1f} MiB held by 8 idle channels"


def _our_cyclic_garbage(run) -> list[str]:
    """What `run()` leaves only the cycle collector could free: our objects, futures, sockets and
    threads among it, by type (gc switched off while it runs, as no full collection would have run
    yet in a busy server)."""
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        run()
        gc.collect()
        names = [f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.garbage]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    return sorted(n for n in names if n.startswith(("orchestrator.", "concurrent.futures.", "socket.", "threading.")))


def test_a_lost_agent_leaves_its_channel_to_reference_counting_not_the_cycle_collector():
    """The agent exits with calls waiting; the callers get the typed error, and a later request is
    refused. Before, one error object was kept by the channel and raised by every caller, gaining
    their frames: channel, futures, socket and buffers stayed until a full collection (about 40 KiB
    per `kill 1`, and a full collection comes after tens of thousands of objects)."""
    from concurrent.futures import TimeoutError as FutureTimeout

    from orchestrator.errors import OpenAgentsError
    from orchestrator.sandbox.channel import Channel, wait

    class Dying:
        def __init__(self) -> None:
            self.go = threading.Event()

        def recv(self, size: int) -> bytes:
            self.go.wait(30)
            return b""  # the agent exited

        def sendall(self, data: bytes) -> None:
            pass

        def close(self) -> None:
            self.go.set()

        def stderr_tail(self) -> bytes:
            return b"x" * 30000

    caught: list[str] = []

    def run() -> None:
        stream = Dying()
        channel = Channel(stream)
        futures = [channel.request("read_file", {"path": "a" * 20000})[1] for _ in range(3)]
        try:
            wait(futures[0], 0.01)
        except FutureTimeout:
            pass
        stream.go.set()
        for future in futures:
            try:
                wait(future, 30)
            except OpenAgentsError as err:
                caught.append(err.type.value)
        try:
            channel.request("list_files", {})
        except OpenAgentsError as err:
            caught.append(err.type.value)
        channel._reader.join(30)
        channel.close()

    assert _our_cyclic_garbage(run) == []
    assert caught == ["agent_lost"] * 4


def test_a_replaced_box_leaves_nothing_to_the_cycle_collector(sandbox_image, docker_client, tmp_path):
    """`kill 1`, the call that found the agent gone, the replacement, a shell whose timeout passes,
    then close: all of it freed by reference counting."""
    from orchestrator.sandbox.docker import DockerSandbox

    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    box = DockerSandbox(ws, SandboxConfig(), client=docker_client)
    outcomes: list[object] = []

    def run() -> None:
        box.start()
        outcomes.append(box.call("shell", {"command": "kill 1; sleep 5"}).error.type.value)
        outcomes.append(box.call("read_file", {"path": "a.txt"}).output)
        outcomes.append(box.call("shell", {"command": "sleep 30", "timeout": 1}).error.type.value)
        box.close()

    try:
        assert _our_cyclic_garbage(run) == []
    finally:
        box.close()
    assert outcomes == ["agent_lost", "a\n", "timeout"] and box.restarts == 1
