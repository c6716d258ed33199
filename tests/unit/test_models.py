"""Model clients against a real HTTP server on loopback: tool calls, retries, broken answers."""

from __future__ import annotations

import time

import pytest

from orchestrator.errors import ErrorType, OpenAgentsError
from orchestrator.models.base import Message, RetryPolicy
from orchestrator.models.dialects import DIALECTS
from orchestrator.models.http import HttpModelClient, preflight
from orchestrator.tools.declarations import declarations
from tests.helpers.fake_model_server import FakeModelServer

FAST = RetryPolicy(max_attempts=3, max_total_s=20, base_delay_s=0.05, max_delay_s=2)
MESSAGES = [Message(role="system", content="s"), Message(role="user", content="fix it")]


@pytest.fixture
def server():
    with FakeModelServer() as srv:
        yield srv


def openai(server, retry=FAST, **kw):
    return HttpModelClient(DIALECTS["openai"], "gpt-test", server.base_url, "sk-test-key-0123456789abcdef", retry, **kw)


def test_openai_tool_call_and_request_shape(server):
    server.openai_turn("reading", [("read_file", {"path": "a.py"})])
    turn = openai(server).complete(MESSAGES, declarations(["read_file"], "openai"))
    assert (
        turn.text == "reading"
        and turn.tool_calls[0].name == "read_file"
        and turn.tool_calls[0].arguments == {"path": "a.py"}
    )  # parsed at the edge
    request = server.requests[0]
    assert request["path"] == "/v1/chat/completions"
    assert request["headers"]["Authorization"] == "Bearer sk-test-key-0123456789abcdef"
    assert request["body"]["model"] == "gpt-test" and request["body"]["tools"][0]["function"]["name"] == "read_file"


def test_openai_honours_retry_after_on_429(server):
    server.reply({"error": "slow down"}, status=429, headers={"Retry-After": "1"}).openai_turn("done")
    started = time.monotonic()
    turn = openai(server).complete(MESSAGES, [])
    assert turn.text == "done" and len(server.requests) == 2
    assert time.monotonic() - started >= 0.9


def test_openai_retries_a_500_and_a_malformed_body(server):
    server.reply({"error": "boom"}, status=500).reply(b"{not json").openai_turn("done")
    assert openai(server).complete(MESSAGES, []).text == "done"
    assert len(server.requests) == 3


def test_openai_gives_a_typed_error_when_retries_run_out(server):
    for _ in range(3):
        server.reply({"error": "down"}, status=503)
    with pytest.raises(OpenAgentsError) as info:
        openai(server).complete(MESSAGES, [])
    assert info.value.type == ErrorType.MODEL_API_ERROR and not info.value.recoverable
    assert "after 3 attempts" in info.value.message and len(server.requests) == 3


def test_openai_client_error_is_not_retried(server):
    server.reply({"error": "bad key"}, status=401)
    with pytest.raises(OpenAgentsError) as info:
        openai(server).complete(MESSAGES, [])
    assert info.value.type == ErrorType.MODEL_API_ERROR and "401" in info.value.message and len(server.requests) == 1


def test_openai_connection_refused_is_a_typed_error():
    client = HttpModelClient(
        DIALECTS["openai"], "m", "http://127.0.0.1:9/v1", "k", RetryPolicy(max_attempts=2, base_delay_s=0.01)
    )
    with pytest.raises(OpenAgentsError) as info:
        client.complete(MESSAGES, [])
    assert info.value.type == ErrorType.MODEL_API_ERROR


def test_openai_unexpected_shape_is_typed(server):
    server.reply({"choices": []})
    with pytest.raises(OpenAgentsError) as info:
        openai(server).complete(MESSAGES, [])
    assert info.value.type == ErrorType.MODEL_API_ERROR and "unexpected shape" in info.value.message


def test_gemini_function_call_and_request_shape(server):
    server.gemini_turn("let me see", [("grep_files", {"pattern": "TODO"})])
    client = HttpModelClient(
        DIALECTS["gemini"], "gemini-test", f"http://127.0.0.1:{server.port}/v1beta", "AIza-test-key", FAST, stream=False
    )
    history = MESSAGES + [
        Message(
            role="assistant", content="", tool_calls=[{"id": "c1", "name": "read_file", "arguments": '{"path": "x"}'}]
        ),
        Message(role="tool", tool_call_id="c1", name="read_file", content="contents"),
    ]
    turn = client.complete(history, declarations(["grep_files"], "gemini"))
    assert turn.tool_calls[0].name == "grep_files" and turn.tool_calls[0].arguments == {"pattern": "TODO"}
    request = server.requests[0]
    assert request["path"] == "/v1beta/models/gemini-test:generateContent"
    assert request["headers"]["x-goog-api-key"] == "AIza-test-key"
    body = request["body"]
    assert body["systemInstruction"]["parts"][0]["text"] == "s"
    assert body["tools"][0]["functionDeclarations"][0]["name"] == "grep_files"
    assert body["contents"][1] == {
        "role": "model",
        "parts": [{"functionCall": {"name": "read_file", "args": {"path": "x"}}}],
    }
    assert body["contents"][2]["parts"][0]["functionResponse"] == {
        "name": "read_file",
        "response": {"content": "contents"},
    }


def test_gemini_retries_429(server):
    server.reply({"error": {"code": 429}}, status=429, headers={"Retry-After": "0"}).gemini_turn("ok")
    client = HttpModelClient(DIALECTS["gemini"], "g", f"http://127.0.0.1:{server.port}/v1beta", "k", FAST)
    assert client.complete(MESSAGES, []).text == "ok" and len(server.requests) == 2


# -- streaming ---------------------------------------------------------------------------------
from orchestrator.models.factory import model_from_spec  # noqa: E402
from orchestrator.models.stream import StreamLimits, sse_events  # noqa: E402
from tests.helpers.fake_model_server import sse  # noqa: E402


def gemini(server, retry=FAST, **kw):
    return HttpModelClient(
        DIALECTS["gemini"], "gemini-test", f"http://127.0.0.1:{server.port}/v1beta", "AIza-test-key", retry, **kw
    )


def anthropic(server, retry=FAST, **kw):
    return HttpModelClient(
        DIALECTS["anthropic"], "claude-test", server.root_url, "sk-ant-test-key-0123456789", retry, **kw
    )


@pytest.mark.parametrize("pieces", [None, 1, 7])
def test_openai_stream_text_and_tool_calls_split_across_deltas(server, pieces):
    """Written a byte at a time or a few: lines and events cut anywhere still parse; the calls'
    arguments come in 3-character pieces and are assembled by index; usage from the last chunk."""
    server.openai_stream(
        "reading two files",
        [("read_file", {"path": "a.py"}), ("grep_files", {"pattern": "TODO", "path": "src"})],
        pieces=pieces,
    )
    seen: list[str] = []
    turn = openai(server).complete(MESSAGES, declarations(["read_file"], "openai"), on_text=seen.append)
    assert "".join(seen) == turn.text == "reading two files" and len(seen) > 1
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [
        ("read_file", {"path": "a.py"}),
        ("grep_files", {"pattern": "TODO", "path": "src"}),
    ]
    assert turn.tool_calls[0].id == "call_s0" and turn.usage["prompt_tokens"] == 11
    body = server.requests[0]["body"]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


def test_openai_stream_broken_arguments_stay_a_typed_call_error(server):
    server.openai_stream("", [("read_file", '{"path": "a.py"')])
    turn = openai(server).complete(MESSAGES, [])
    assert turn.tool_calls[0].arguments_error and turn.tool_calls[0].raw_arguments == '{"path": "a.py"'


def test_a_server_that_ignores_stream_is_read_whole(server):
    server.openai_turn("whole answer")
    seen: list[str] = []
    assert openai(server).complete(MESSAGES, [], on_text=seen.append).text == "whole answer" and seen == []


def test_non_streamed_mode_sends_no_stream_flag(server):
    server.openai_turn("done")
    client = HttpModelClient(DIALECTS["openai"], "m", server.base_url, "", FAST, stream=False)
    assert client.complete(MESSAGES, []).text == "done" and "stream" not in server.requests[0]["body"]


def test_gemini_stream_text_function_call_usage(server):
    server.gemini_stream("let me look", [("grep_files", {"pattern": "TODO"})], pieces=5)
    seen: list[str] = []
    turn = gemini(server).complete(MESSAGES, declarations(["grep_files"], "gemini"), on_text=seen.append)
    assert "".join(seen) == turn.text == "let me look"
    assert turn.tool_calls[0].name == "grep_files" and turn.tool_calls[0].arguments == {"pattern": "TODO"}
    assert turn.usage["promptTokenCount"] == 13
    assert server.requests[0]["path"] == "/v1beta/models/gemini-test:streamGenerateContent?alt=sse"


def test_anthropic_request_shape_tool_use_and_tool_result_blocks(server):
    server.anthropic_turn("reading", [("read_file", {"path": "a.py"})])
    history = MESSAGES + [
        Message(
            role="assistant",
            content="",
            tool_calls=[
                {"id": "toolu_1", "name": "read_file", "arguments": '{"path": "x"}'},
                {"id": "toolu_2", "name": "read_file", "arguments": '{"path": "y"}'},
            ],
        ),
        Message(role="tool", tool_call_id="toolu_1", name="read_file", content="one"),
        Message(role="tool", tool_call_id="toolu_2", name="read_file", content="two"),
    ]
    turn = anthropic(server, stream=False).complete(history, declarations(["read_file"], "anthropic"))
    assert (
        turn.text == "reading"
        and turn.tool_calls[0].name == "read_file"
        and turn.tool_calls[0].arguments == {"path": "a.py"}
    )
    assert turn.usage == {"input_tokens": 21, "output_tokens": 9}
    request = server.requests[0]
    assert request["path"] == "/v1/messages"
    assert (
        request["headers"]["x-api-key"] == "sk-ant-test-key-0123456789"
        and request["headers"]["anthropic-version"] == "2023-06-01"
    )
    body = request["body"]
    assert body["system"] == "s" and body["max_tokens"] > 0 and body["model"] == "claude-test"
    assert body["tools"][0]["name"] == "read_file" and body["tools"][0]["input_schema"]["type"] == "object"
    assert body["messages"][1] == {
        "role": "assistant",
        "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "x"}},
            {"type": "tool_use", "id": "toolu_2", "name": "read_file", "input": {"path": "y"}},
        ],
    }
    assert body["messages"][2] == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "one"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "two"},
        ],
    }


@pytest.mark.parametrize("pieces", [None, 1, 11])
def test_anthropic_stream_with_input_json_deltas(server, pieces):
    server.anthropic_stream(
        "I will edit", [("edit_file", {"path": "a.py", "old_text": "x", "new_text": "y"})], pieces=pieces
    )
    seen: list[str] = []
    turn = anthropic(server).complete(MESSAGES, [], on_text=seen.append)
    assert "".join(seen) == turn.text == "I will edit"
    assert turn.tool_calls[0].id == "toolu_s0" and turn.tool_calls[0].arguments == {
        "path": "a.py",
        "old_text": "x",
        "new_text": "y",
    }
    assert turn.usage["input_tokens"] == 21 and turn.usage["output_tokens"] == 9
    assert server.requests[0]["body"]["stream"] is True


def test_anthropic_529_overloaded_with_retry_after_is_tried_again(server):
    server.reply(
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
        status=529,
        headers={"retry-after": "1"},
    )
    server.anthropic_stream("done")
    notices = []
    started = time.monotonic()
    turn = anthropic(server, FAST.model_copy(update={"on_retry": notices.append})).complete(MESSAGES, [])
    assert turn.text == "done" and len(server.requests) == 2 and time.monotonic() - started >= 0.9
    assert notices[0].problem == "HTTP 529"


def test_anthropic_overloaded_error_event_before_any_text_is_tried_again(server):
    server.stream([sse({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}, "error")])
    server.anthropic_stream("done")
    assert anthropic(server).complete(MESSAGES, []).text == "done" and len(server.requests) == 2


def test_a_stream_cut_after_text_was_shown_is_not_asked_again(server):
    """Said twice would be worse than said once: the broken stream is a typed error."""
    server.stream(FakeModelServer.anthropic_events("partial answer")[:4])  # no message_stop
    server.anthropic_stream("never asked")
    with pytest.raises(OpenAgentsError) as info:
        anthropic(server).complete(MESSAGES, [], on_text=lambda _: None)
    assert (
        info.value.type == ErrorType.MODEL_API_ERROR and "broke off" in info.value.message and len(server.requests) == 1
    )


def test_a_stream_cut_before_any_text_is_retried(server):
    server.stream(FakeModelServer.openai_events("hello")[:1])  # the role chunk only, then the end
    server.openai_stream("hello")
    assert openai(server).complete(MESSAGES, [], on_text=lambda _: None).text == "hello" and len(server.requests) == 2


@pytest.mark.parametrize("family", ["openai", "gemini", "anthropic"])
def test_a_silent_server_is_a_typed_error_within_the_model_timeout(server, family):
    server.hang(30)
    client = {"openai": openai, "gemini": gemini, "anthropic": anthropic}[family](server, timeout_s=1.0)
    started = time.monotonic()
    with pytest.raises(OpenAgentsError) as info:
        client.complete(MESSAGES, [])
    assert info.value.type == ErrorType.MODEL_API_ERROR and "--model-timeout" in info.value.message
    assert time.monotonic() - started < 3 and len(server.requests) == 1  # not waited for again


def test_a_stream_that_goes_silent_midway_is_a_typed_error(server):
    events = FakeModelServer.openai_events("slow")
    server.stream(events[:2] + [b": keep-alive\n\n"] * 0, delay_s=5)
    started = time.monotonic()
    with pytest.raises(OpenAgentsError) as info:
        openai(server, RetryPolicy(max_attempts=1), timeout_s=1.0).complete(MESSAGES, [], on_text=lambda _: None)
    assert info.value.type == ErrorType.MODEL_API_ERROR and time.monotonic() - started < 4


# -- the stream parser: untrusted input ----------------------------------------------------------
def test_sse_parser_bounds_and_types():
    small = StreamLimits(max_line_bytes=64, max_event_bytes=128, max_total_bytes=1024, max_events=3)
    with pytest.raises(OpenAgentsError, match="one line"):
        list(sse_events([b"data: " + b"x" * 100], small))  # no newline ever: refused once over, not buffered
    with pytest.raises(OpenAgentsError, match="one event"):
        list(sse_events([b"data: " + b"1" * 50 + b"\n"] * 3 + [b"\n"], small))
    with pytest.raises(OpenAgentsError, match="whole answer"):
        list(sse_events([b": ping\n"] * 200, small))
    with pytest.raises(OpenAgentsError, match="over 3 events"):
        list(sse_events([b"data: {}\n\n"] * 4, small))
    with pytest.raises(OpenAgentsError, match="deeper"):
        list(sse_events([b"data: " + b"[" * 100_000 + b"\n\n"]))
    with pytest.raises(OpenAgentsError, match="not JSON"):
        list(sse_events([b"data: {nope\n\n"]))
    with pytest.raises(OpenAgentsError, match="not UTF-8"):
        list(sse_events([b"event: \xff\xfe\ndata: {}\n\n"]))
    events = list(
        sse_events(
            [b": hello\r\nevent: a\r", b'\ndata: {"x":\r\ndata: 1}\r\n\r\n', b"data: [DONE]\n\n", b'data: {"half"']
        )
    )
    assert [(e.event, e.data, e.done) for e in events] == [("a", {"x": 1}, False), ("message", None, True)]


def test_an_endless_stream_is_cut_at_the_total_bound(server):
    server.stream([sse({"choices": [{"index": 0, "delta": {"content": "x" * 1000}}]})] * 2000)
    with pytest.raises(OpenAgentsError) as info:
        openai(server, limits=StreamLimits(max_total_bytes=100_000)).complete(MESSAGES, [])
    assert info.value.type == ErrorType.MODEL_API_ERROR and "whole answer" in info.value.message


# -- the endpoint, before anything starts ---------------------------------------------------------
def test_preflight_refused_port_is_typed_and_fast():
    import socket

    with socket.socket() as sock:  # a port surely closed: bound, never listened on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(OpenAgentsError) as info:
            preflight(f"http://127.0.0.1:{port}/v1", "the OpenAI-compatible API")
    assert info.value.type == ErrorType.MODEL_API_ERROR and "cannot connect" in info.value.message
    assert time.monotonic() - started < 1.5


def test_preflight_passes_a_listening_server(server):
    preflight(server.base_url, "x")
    assert server.requests == []  # a connection, no request


def test_anthropic_spec_key_and_base_url(monkeypatch, server):
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.root_url)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    client = model_from_spec("anthropic:claude-test")  # loopback: no key needed
    server.anthropic_stream("hi")
    assert client.family == "anthropic" and client.complete(MESSAGES, []).text == "hi"
    assert "x-api-key" not in server.requests[0]["headers"]
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "https://api.anthropic.com")
    with pytest.raises(OpenAgentsError) as info:
        model_from_spec("anthropic:claude-test")
    assert info.value.type == ErrorType.CONFIG_INVALID and "ANTHROPIC_API_KEY" in info.value.message
    server.anthropic_stream("via base url")
    assert (
        model_from_spec("anthropic:c", base_url=server.base_url).complete(MESSAGES, []).text == "via base url"
    )  # .../v1 given: no /v1/v1
    assert server.requests[-1]["path"] == "/v1/messages"


def test_openai_responses_spec_over_loopback(monkeypatch, server):
    """`openai-responses:NAME`: the Responses API's event stream, through the factory, on loopback."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    server.stream(
        [
            sse({"type": "response.output_text.delta", "output_index": 0, "delta": "he"}, "response.output_text.delta"),
            sse(
                {"type": "response.output_text.delta", "output_index": 0, "delta": "llo"}, "response.output_text.delta"
            ),
            sse(
                {"type": "response.completed", "response": {"usage": {"input_tokens": 3, "output_tokens": 1}}},
                "response.completed",
            ),
        ],
        pieces=7,
    )
    client = model_from_spec("openai-responses:gpt-test", base_url=server.base_url)
    seen: list[str] = []
    turn = client.complete(MESSAGES, declarations(["read_file"], "openai-responses"), on_text=seen.append)
    assert (
        client.family == "openai-responses"
        and turn.text == "hello"
        and seen == ["he", "llo"]
        and turn.usage["input_tokens"] == 3
    )
    request = server.requests[0]
    assert (
        request["path"] == "/v1/responses"
        and request["body"]["instructions"] == "s"
        and request["body"]["store"] is False
    )
    assert (
        request["body"]["input"] == [{"role": "user", "content": "fix it"}]
        and request["body"]["tools"][0]["name"] == "read_file"
    )
