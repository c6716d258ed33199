"""The start gate (orchestrator/sandbox/starts.py): at most N sandbox starts of one process in
flight, the rest in line first come first served, each told its place while it waits. The gate's
own logic is tested with plain threads; then real containers show every start (the first and a
restart after `kill 1`) goes through it."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from orchestrator.config import SandboxConfig
from orchestrator.sandbox.starts import START_GATE, StartGate, StartQueued
from tests.helpers import make_workspace
from tests.helpers.start_gate import WAIT_S, wait_until


class OnlySlotHeld:
    """The process's start gate at a limit of one, its slot held by a thread of the test's until
    release(): a box that starts meanwhile has to wait in line."""

    def __init__(self) -> None:
        self._release, holding = threading.Event(), threading.Event()

        def hold() -> None:
            with START_GATE.slot(1):
                holding.set()
                self._release.wait(WAIT_S)

        self._holder = threading.Thread(target=hold)
        self._holder.start()
        assert holding.wait(WAIT_S)

    def release(self) -> None:
        self._release.set()
        self._holder.join(WAIT_S)


def test_waiters_enter_first_come_first_served_and_hear_their_place():
    gate = StartGate()
    release = threading.Event()
    entered: list[int] = []
    heard: dict[int, list[StartQueued]] = {n: [] for n in range(3)}

    def holder():
        with gate.slot(1):
            release.wait()

    def waiter(n: int):
        with gate.slot(1, heard[n].append):
            entered.append(n)

    threads = [threading.Thread(target=holder)]
    threads[0].start()
    wait_until(lambda: gate.counters().in_flight == 1, "the holder has its slot")
    for n in range(3):
        threads.append(threading.Thread(target=waiter, args=(n,)))
        threads[-1].start()
        wait_until(lambda n=n: gate.counters().waiting == n + 1, f"waiter {n} is in line")
    wait_until(lambda: all(heard[n] for n in range(3)), "every waiter heard its place")
    assert [heard[n][0].ahead for n in range(3)] == [0, 1, 2]
    assert all(heard[n][0].starting == 1 and heard[n][0].limit == 1 and not heard[n][0].slot_taken for n in range(3))
    release.set()
    for thread in threads:
        thread.join(WAIT_S)
    assert entered == [0, 1, 2]
    for n in range(3):
        assert heard[n][-1].slot_taken and heard[n][-1].ahead == 0 and heard[n][-1].waited_s >= heard[n][0].waited_s
    counters = gate.counters()
    assert (counters.started, counters.queued, counters.peak_in_flight, counters.in_flight, counters.waiting) == (
        4,
        3,
        1,
        0,
        0,
    )


def test_no_report_when_a_slot_is_free_and_the_limit_is_each_starts_own():
    gate = StartGate()
    heard: list[StartQueued] = []
    with gate.slot(2, heard.append):
        with gate.slot(2, heard.append):
            assert gate.counters().in_flight == 2
    assert heard == [] and gate.counters().queued == 0


def test_a_waiter_interrupted_in_line_leaves_it():
    """Ctrl-C while in line: the ones behind it must not wait for a start that will never come."""
    gate = StartGate()
    release = threading.Event()
    outcome: dict[str, object] = {}

    def holder():
        with gate.slot(1):
            release.wait()

    def interrupted(_progress: StartQueued) -> None:
        raise KeyboardInterrupt

    def impatient():
        try:
            with gate.slot(1, interrupted):
                outcome["entered"] = True
        except KeyboardInterrupt:
            outcome["interrupted"] = True

    def patient():
        with gate.slot(1):
            outcome["patient"] = True

    first = threading.Thread(target=holder)
    first.start()
    wait_until(lambda: gate.counters().in_flight == 1, "the holder has its slot")
    second = threading.Thread(target=impatient)
    second.start()
    second.join(WAIT_S)
    assert outcome == {"interrupted": True} and gate.counters().waiting == 0
    third = threading.Thread(target=patient)
    third.start()
    release.set()
    for thread in (first, third):
        thread.join(WAIT_S)
    assert outcome.get("patient") is True and gate.counters().in_flight == 0


def test_a_failing_listener_does_not_fail_the_start():
    gate = StartGate()
    release = threading.Event()

    def holder():
        with gate.slot(1):
            release.wait()

    def broken(_progress: StartQueued) -> None:
        raise RuntimeError("a front-end bug")

    first = threading.Thread(target=holder)
    first.start()
    wait_until(lambda: gate.counters().in_flight == 1, "the holder has its slot")
    done = threading.Event()

    def waiter():
        with gate.slot(1, broken):
            done.set()

    second = threading.Thread(target=waiter)
    second.start()
    wait_until(lambda: gate.counters().waiting == 1, "the waiter is in line")
    release.set()
    for thread in (first, second):
        thread.join(WAIT_S)
    assert done.is_set()


def test_start_concurrency_comes_from_the_environment_and_is_checked(monkeypatch):
    assert SandboxConfig().start_concurrency == 4
    monkeypatch.setenv("OA_START_CONCURRENCY", "7")
    assert SandboxConfig().start_concurrency == 7
    monkeypatch.setenv("OA_START_CONCURRENCY", "0")
    with pytest.raises(ValueError, match="start_concurrency"):
        SandboxConfig()


@pytest.mark.docker
def test_six_sandboxes_started_at_once_never_hold_more_than_two_slots(sandbox_image, docker_client, tmp_path):
    from orchestrator.sandbox.docker import DockerSandbox

    config = SandboxConfig(start_concurrency=2)
    boxes = [
        DockerSandbox(make_workspace(tmp_path / f"ws{n}", {"who.txt": f"box {n}\n"}), config, client=docker_client)
        for n in range(6)
    ]
    heard: list[list[StartQueued]] = [[] for _ in boxes]
    for box, events in zip(boxes, heard, strict=True):
        box.on_start_queue = events.append
    together = threading.Barrier(len(boxes))

    def start(box):
        together.wait()
        box.start()

    START_GATE.reset_counters()
    try:
        with ThreadPoolExecutor(max_workers=len(boxes)) as threads:
            list(threads.map(start, boxes))
        counters = START_GATE.counters()
        assert counters.started == 6, "a start went around the gate"
        assert counters.peak_in_flight == 2, f"the gate let {counters.peak_in_flight} starts run at once (limit 2)"
        assert counters.queued >= 1, "six starts at once, and none waited"
        waited = [events for events in heard if events]
        assert len(waited) == counters.queued, "a start that waited was not shown as waiting"
        for events in waited:
            assert events[0].limit == 2 and not events[0].slot_taken and events[-1].slot_taken
        for n, box in enumerate(boxes):
            assert box.call("read_file", {"path": "who.txt"}).output == f"box {n}\n"
    finally:
        with ThreadPoolExecutor(max_workers=len(boxes)) as threads:
            list(threads.map(lambda box: box.close(), boxes))
    for box in boxes:
        assert (
            docker_client.containers.list(
                all=True, filters={"label": f"dev.openagents.sandbox.workspace={box.workspace}"}
            )
            == []
        )


@pytest.mark.docker
def test_a_restart_after_the_agent_is_killed_waits_in_the_same_line(sandbox_image, docker_client, tmp_path):
    from orchestrator.sandbox.docker import DockerSandbox

    heard: list[StartQueued] = []
    queued = threading.Event()

    def on_queue(progress: StartQueued) -> None:
        heard.append(progress)
        queued.set()

    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    with DockerSandbox(ws, SandboxConfig(start_concurrency=1), client=docker_client) as box:
        box.on_start_queue = on_queue
        slot = OnlySlotHeld()
        results = {}
        caller = threading.Thread(
            target=lambda: results.update(
                kill=box.call("shell", {"command": "kill 1; sleep 5"}), after=box.call("read_file", {"path": "a.txt"})
            )
        )
        caller.start()
        try:
            assert queued.wait(WAIT_S), "the restart did not wait for the start slot another start held"
            assert not results, "a call finished while its box's restart could not have started"
        finally:
            slot.release()
            caller.join(WAIT_S)
        assert results["after"].output == "a\n"
        assert box.restarts >= 1
        assert heard[0].ahead == 0 and heard[0].starting == 1 and heard[-1].slot_taken


@pytest.mark.docker
def test_a_session_whose_start_waits_shows_it_live_and_records_the_wait(sandbox_image, tmp_path, monkeypatch):
    """What `run` shows: while the session's box waits for a start slot, the live view gets the place
    in line (not written to the transcript); once it starts, the wait is recorded once."""
    from orchestrator.events import SandboxStartQueued, parse
    from orchestrator.policy.approvals import NonInteractiveApprover
    from orchestrator.session import SandboxOptions, open_session
    from orchestrator.terminal.painter import Painter
    from orchestrator.workspace.records import WorkspaceMode

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    script = tmp_path / "model.jsonl"
    script.write_text('{"text": "nothing to do"}\n')
    live: list[dict] = []
    queued = threading.Event()

    def on_event(record: dict) -> None:
        live.append(record)
        if record["type"] == "sandbox_start_queued":
            queued.set()

    slot = OnlySlotHeld()
    opened = {}
    transcript = tmp_path / "t.jsonl"
    opener = threading.Thread(
        target=lambda: opened.update(
            s=open_session(
                SandboxOptions(model=f"script:{script}"),
                ws,
                SandboxConfig(start_concurrency=1),
                NonInteractiveApprover(),
                transcript,
                on_event,
                mode=WorkspaceMode.BIND,
            )
        )
    )
    opener.start()
    try:
        assert queued.wait(WAIT_S), "the session's start waited for a slot and said nothing"
    finally:
        slot.release()
        opener.join(WAIT_S)
    session = opened["s"]
    try:
        assert session.box.call("read_file", {"path": "a.txt"}).output == "a\n"
    finally:
        session.close()
    shown = [parse(r) for r in live if r["type"] == "sandbox_start_queued"]
    assert isinstance(shown[0], SandboxStartQueued) and not shown[0].slot_taken and shown[-1].slot_taken
    assert "waiting for a start slot: 0 ahead, 1 of 1 starting" in Painter().event_lines(shown[0])[0].text
    assert "after" in Painter().event_lines(shown[-1])[0].text
    written = [json.loads(line) for line in transcript.read_text().splitlines()]
    assert [r["slot_taken"] for r in written if r["type"] == "sandbox_start_queued"] == [True], (
        "the transcript keeps one record of the wait"
    )


def test_requests_from_many_threads_on_many_urls_share_one_pool_that_is_never_closed(docker_client):
    """docker-py kept a pool per request URL and closed the oldest past 25, under requests still
    using it: 100 boxes closing at once died of urllib3's AttributeError, or would read its
    ClosedPoolError as a lost daemon. Sixty threads, each on URLs of its own (a container that does
    not exist: Docker's 404, typed), plus pings, as a hundred boxes' calls are."""
    import docker.errors

    adapter = docker_client.api.adapters["http+docker://"]
    failures: list[str] = []

    def one_thread(i: int) -> None:
        for k in range(10):
            try:
                docker_client.api.inspect_container(f"oa-no-such-box-{i}-{k}")
            except docker.errors.NotFound:
                pass
            except Exception as err:  # noqa: BLE001 - any other outcome is the failure under test
                failures.append(f"{type(err).__name__}: {err}")
            docker_client.ping()

    with ThreadPoolExecutor(60) as pool:
        list(pool.map(one_thread, range(60)))
    assert failures == []
    assert len(adapter.pools) == 1, f"{len(adapter.pools)} pools for one socket"
    only = adapter.pools[next(iter(adapter.pools.keys()))]
    assert only.pool is not None, "the pool was closed"
