"""Model clients against a real HTTP server on loopback: tool calls, retries, broken answers."""
from __future__ import annotations

import time

import pytest

from orchestrator.errors import ErrorType, OpenAgentsError
from orchestrator.models.base import Message, RetryPolicy
from orchestrator.models.gemini import GeminiClient
from orchestrator.models.openai import OpenAIChatClient
from orchestrator.tools.declarations import declarations
from tests.fake_model_server import FakeModelServer

FAST = RetryPolicy(max_attempts=3, max_total_s=20, base_delay_s=0.05, max_delay_s=2)
MESSAGES = [Message(role="system", content="s"), Message(role="user", content="fix it")]


@pytest.fixture
def server():
    with FakeModelServer() as srv:
        yield srv


def openai(server, retry=FAST):
    return OpenAIChatClient("gpt-test", server.base_url, "sk-test-key-0123456789abcdef", retry)


def test_openai_tool_call_and_request_shape(server):
    server.openai_turn("reading", [("read_file", {"path": "a.py"})])
    turn = openai(server).complete(MESSAGES, declarations(["read_file"], "openai"))
    assert turn.text == "reading" and turn.tool_calls[0].name == "read_file" and turn.tool_calls[0].arguments == {"path": "a.py"}  # parsed at the edge
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
    client = OpenAIChatClient("m", "http://127.0.0.1:9/v1", "k", RetryPolicy(max_attempts=2, base_delay_s=0.01))
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
    client = GeminiClient("gemini-test", f"http://127.0.0.1:{server.port}/v1beta", "AIza-test-key", FAST)
    history = MESSAGES + [
        Message(role="assistant", content="", tool_calls=[{"id": "c1", "name": "read_file", "arguments": '{"path": "x"}'}]),
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
    assert body["contents"][1] == {"role": "model", "parts": [{"functionCall": {"name": "read_file", "args": {"path": "x"}}}]}
    assert body["contents"][2]["parts"][0]["functionResponse"] == {"name": "read_file", "response": {"content": "contents"}}


def test_gemini_retries_429(server):
    server.reply({"error": {"code": 429}}, status=429, headers={"Retry-After": "0"}).gemini_turn("ok")
    client = GeminiClient("g", f"http://127.0.0.1:{server.port}/v1beta", "k", FAST)
    assert client.complete(MESSAGES, []).text == "ok" and len(server.requests) == 2
