"""Deeply nested JSON from any side (the model, the box, an editor, a transcript) is refused with a
typed error before the parser recurses: no parse of hostile input ever runs near the stack limit.

Catching RecursionError after the fact was not enough: CI saw a garbage-collection finaliser fail
with an unraisable RecursionError while the host parsed fifty thousand "[" from the model. The probe
below makes that visible on every run: with collection forced on every allocation, a callback checks
that 60 more frames still fit; a parse that goes deep makes it fail."""

from __future__ import annotations

import gc
import io
import json
import random
import threading
import time
from collections.abc import Iterator

import pytest

from orchestrator.acp.server import AcpServer
from orchestrator.errors import ErrorType, OpenAgentsError
from orchestrator.models.base import Message, RetryPolicy
from orchestrator.models.dialects import DIALECTS
from orchestrator.models.http import HttpModelClient
from orchestrator.sandbox.channel import Channel
from orchestrator.tools.args import parse_arguments
from orchestrator.transcript import show_lines
from sandbox_agent import jsonbound
from sandbox_agent import server as agent_server
from tests.helpers.fake_model_server import FakeModelServer

DEEP = [
    "[" * 50_000 + "]" * 50_000,
    "[" * 50_000,  # never closed: the parser recurses all the same
    '{"a":' * 20_000 + "1" + "}" * 20_000,
    '{"path": "x", "k": ' + "[{" * 5_000 + "}]" * 5_000 + "}",
]


def _dive(n: int) -> int:
    return 0 if n == 0 else 1 + _dive(n - 1)


@pytest.fixture
def stack_probe() -> Iterator[list[str]]:
    """Failures of a 60-frame dive run by the collector, on whatever thread allocates."""
    failures: list[str] = []

    def probe(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            try:
                _dive(60)
            except RecursionError:
                failures.append(threading.current_thread().name)

    threshold = gc.get_threshold()
    gc.set_threshold(1)
    gc.callbacks.append(probe)
    try:
        yield failures
    finally:
        gc.callbacks.remove(probe)
        gc.set_threshold(*threshold)


def test_the_probe_sees_an_unbounded_parse(stack_probe):
    """The control: plain json.loads on the same input trips the probe, so the tests below can fail."""
    with pytest.raises(RecursionError):
        json.loads(DEEP[0])
    assert stack_probe


@pytest.mark.parametrize("text", DEEP, ids=["closed", "unclosed", "objects", "inside-arguments"])
def test_model_arguments_nested_deep_are_invalid_arguments(stack_probe, text):
    with pytest.raises(OpenAgentsError) as info:
        parse_arguments(text)
    assert info.value.type == ErrorType.INVALID_ARGUMENTS and info.value.recoverable
    assert "nested more than" in info.value.message
    assert stack_probe == []


def test_arguments_nested_within_the_bound_still_parse():
    value = {"path": "a", "x": json.loads("[" * 60 + "]" * 60), "s": "[[[[" * 1000}
    assert parse_arguments(json.dumps(value)) == value


class _Replay:
    """An agent stream that sends `data` and then ends, as a hostile agent could."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)

    def recv(self, size: int) -> bytes:
        return self._data.read(size)

    def sendall(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        pass

    def stderr_tail(self) -> bytes:
        return b""


@pytest.mark.parametrize("text", DEEP[:3], ids=["closed", "unclosed", "objects"])
def test_an_agent_answer_nested_deep_breaks_the_channel_typed(stack_probe, text):
    channel = Channel(_Replay(text.encode() + b"\n"))
    deadline = time.monotonic() + 10
    while channel.broken is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert channel.broken is not None and channel.broken.type == ErrorType.PROTOCOL_ERROR
    assert stack_probe == []


def test_the_agent_refuses_a_request_nested_deep(stack_probe: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[dict[str, object]] = []
    monkeypatch.setattr(agent_server, "_send", sent.append)
    assert agent_server._accept(DEEP[0].encode()) is None
    assert sent and sent[0]["id"] is None and sent[0]["error"]["type"] == "protocol_error"  # type: ignore[index]
    assert stack_probe == []


def test_an_editor_line_nested_deep_is_a_parse_error(stack_probe: list[str]) -> None:
    out = io.BytesIO()
    server = AcpServer(factory=None, stdin=io.BytesIO(), stdout=out)  # type: ignore[arg-type]
    server._handle_line(DEEP[0].encode())
    reply = json.loads(out.getvalue())
    assert reply["id"] is None and reply["error"]["code"] == -32700
    assert stack_probe == []


def test_a_model_answer_nested_deep_is_a_typed_model_error(stack_probe):
    with FakeModelServer() as server:
        for _ in range(2):
            server.reply(DEEP[0].encode())
        client = HttpModelClient(
            DIALECTS["openai"], "m", server.base_url, "k", RetryPolicy(max_attempts=2, base_delay_s=0.01)
        )
        with pytest.raises(OpenAgentsError) as info:
            client.complete([Message(role="user", content="hi")], [])
    assert info.value.type == ErrorType.MODEL_API_ERROR
    assert stack_probe == []


def test_a_transcript_line_nested_deep_is_shown_unreadable(stack_probe, tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(DEEP[0] + "\n")
    lines = list(show_lines(path))
    assert len(lines) == 1 and "unreadable" in str(lines[0])
    assert stack_probe == []


def _depth(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


def _random_json(rng: random.Random, levels: int) -> object:
    if levels == 0 or rng.random() < 0.2:
        return rng.choice([1, None, 'a["{', "}]\\", "é[", "", '\\"[', '"'])
    if rng.random() < 0.5:
        return [_random_json(rng, levels - 1) for _ in range(rng.randint(0, 3))]
    return {f'k{i}"]': _random_json(rng, levels - 1) for i in range(rng.randint(0, 3))}


@pytest.mark.parametrize("piece", [64 * 1024, 1, 2, 3, 7], ids=lambda n: f"piece-{n}")
def test_the_count_is_exact_on_json_and_ignores_brackets_in_strings(monkeypatch, piece):
    """Against the real depth of random JSON whose strings hold brackets, quotes and backslashes;
    with tiny pieces too, so that strings and escapes straddle the pieces' edges."""
    monkeypatch.setattr(jsonbound, "_PIECE", piece)
    rng = random.Random(7)
    for _ in range(1000 if piece > 100 else 300):
        value = _random_json(rng, rng.randint(0, 12))
        text = json.dumps(value, ensure_ascii=rng.random() < 0.5).encode()
        depth = _depth(value)
        for limit in range(14):
            assert jsonbound.deeper_than(text, limit) == (depth > limit), (text, limit)


def test_bytes_are_read_as_utf8_only():
    """json.loads guesses UTF-16 from NULs, where a quote byte can be half of a character (U+2222 is
    two of them) and the count would not follow the parse: only UTF-8 is taken."""
    utf16 = ('["\u2222' + "[" * 100 + '"]').encode("utf-16-le")
    with pytest.raises(ValueError):
        jsonbound.loads(utf16)
    assert jsonbound.loads('{"a": "é[["}'.encode()) == {"a": "é[["}


@pytest.mark.parametrize(
    "data",
    [b"[]" * (4 << 20), b"[" + b'"[",' * (2 << 20) + b"1]", b'["' + b'\\"[' * (3 << 20) + b'"]'],
    ids=["brackets", "strings", "escapes"],
)
def test_the_count_of_a_large_line_is_bounded(data):
    """8 to 12 MiB lines of the shapes that cost most (a quarter of a second to a second here; the
    regular expression this replaced kept hundreds of MB for some)."""
    assert jsonbound.deeper_than(data, 64) is False


def test_a_finished_line_over_the_cap_is_refused_unparsed(monkeypatch):
    """The line cap holds for a line that ends inside the chunk that brought it, not only for one
    still unfinished: it is refused before it is parsed."""
    from orchestrator.sandbox import channel as channel_module

    monkeypatch.setattr(channel_module, "MAX_LINE_BYTES", 1000)
    line = json.dumps({"v": 1, "id": 1, "ok": True, "output": "x" * 2000}).encode() + b"\n"
    channel = Channel(_Replay(line))
    deadline = time.monotonic() + 10
    while channel.broken is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert channel.broken is not None and channel.broken.type == ErrorType.PROTOCOL_ERROR
    assert "over 1000 bytes" in channel.broken.message
