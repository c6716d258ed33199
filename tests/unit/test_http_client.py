"""The one HTTP model client driven through httpx's own seam, `httpx.MockTransport`: the exact
bytes it sends, its retries on 429/5xx and broken connections, its typed fatal errors, malformed
answers, a stream cut midway. (tests/unit/test_models.py drives the same client against a real server
on loopback.) And a family made in this file alone, to show that a new family is one dialect."""

from __future__ import annotations

import json
import os
from typing import Any, Iterator

import httpx
import pytest

from orchestrator.errors import ErrorType, OpenAgentsError
from orchestrator.models.base import Message, ModelTurn, RetryPolicy, TextSink, ToolCall
from orchestrator.models.dialects import DIALECTS, Assembler, Dialect, dialect
from orchestrator.models.factory import key_variable, model_from_spec
from orchestrator.models.http import HttpModelClient
from orchestrator.models.stream import SSEEvent
from orchestrator.tools.declarations import declarations
from tests.helpers.fake_model_server import FakeModelServer, sse

FAST = RetryPolicy(max_attempts=3, max_total_s=20, base_delay_s=0.01, max_delay_s=0.05)
MESSAGES = [Message(role="system", content="s"), Message(role="user", content="fix it")]
URLS = {
    "openai": "http://model.test/v1",
    "gemini": "http://model.test/v1beta",
    "anthropic": "http://model.test",
    "openai-responses": "http://model.test/v1",
}
WHOLE = {
    "openai": {"choices": [{"message": {"content": "done"}}], "usage": {"prompt_tokens": 5}},
    "gemini": {
        "candidates": [{"content": {"parts": [{"text": "done"}]}, "finishReason": "STOP"}],
        "usageMetadata": {"promptTokenCount": 5},
    },
    "anthropic": {"content": [{"type": "text", "text": "done"}], "usage": {"input_tokens": 5}},
    "openai-responses": {
        "status": "completed",
        "output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}]}],
        "usage": {"input_tokens": 5},
    },
}


class Script:
    """A MockTransport handler: answers from a queue (a Response, or an exception to raise), and
    records every request as sent."""

    def __init__(self, *answers: httpx.Response | Exception) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.requests.append(request)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(r.content) for r in self.requests]


class CutStream(httpx.SyncByteStream):
    """Some bytes of an event stream, then the connection breaks."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces

    def __iter__(self) -> Iterator[bytes]:
        yield from self.pieces
        raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")


def events(raw: list[bytes]) -> httpx.Response:
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=b"".join(raw))


def client(
    family: str, script: Script, stream: bool = False, retry: RetryPolicy = FAST, key: str = "sk-test-0123456789"
) -> HttpModelClient:
    return HttpModelClient(
        dialect(family), "m-1", URLS[family], key, retry, stream=stream, transport=httpx.MockTransport(script)
    )


@pytest.mark.parametrize("family", list(DIALECTS))
def test_a_whole_answer_and_the_exact_request(family):
    script = Script(httpx.Response(200, json=WHOLE[family]))
    tools = declarations(["read_file"], family)
    turn = client(family, script).complete(MESSAGES, tools)
    assert turn.text == "done" and turn.usage and len(script.requests) == 1
    sent = script.requests[0]
    assert sent.method == "POST" and str(sent.url) == dialect(family).url(URLS[family], "m-1", False)
    assert {k: sent.headers[k] for k in dialect(family).headers("sk-test-0123456789")} == dialect(family).headers(
        "sk-test-0123456789"
    )
    assert json.loads(sent.content) == dialect(family).request(
        "m-1", MESSAGES, tools, False
    )  # the body is the dialect's, untouched


def test_streamed_text_reaches_the_watcher_as_it_comes():
    script = Script(events(FakeModelServer.openai_events("streamed text", [("read_file", {"path": "a"})])))
    seen: list[str] = []
    turn = client("openai", script, stream=True).complete(MESSAGES, [], on_text=seen.append)
    assert "".join(seen) == turn.text == "streamed text" and turn.tool_calls[0].arguments == {"path": "a"}
    assert script.bodies()[0]["stream"] is True


@pytest.mark.parametrize("status", [429, 500, 502, 503, 529])
def test_429_and_5xx_are_tried_again_with_a_notice(status):
    notices = []
    script = Script(
        httpx.Response(status, json={"error": "busy"}, headers={"retry-after": "0"}),
        httpx.Response(200, json=WHOLE["anthropic"]),
    )
    turn = client("anthropic", script, retry=FAST.model_copy(update={"on_retry": notices.append})).complete(
        MESSAGES, []
    )
    assert turn.text == "done" and len(script.requests) == 2
    assert [n.problem for n in notices] == [f"HTTP {status}"] and notices[0].line().startswith(
        f"HTTP {status}, retry 2/3"
    )
    assert script.bodies()[0] == script.bodies()[1]  # the same request again


def test_retries_run_out_into_a_typed_fatal_error():
    script = Script(*[httpx.Response(503, text="down") for _ in range(3)])
    with pytest.raises(OpenAgentsError) as info:
        client("gemini", script).complete(MESSAGES, [])
    assert info.value.type == ErrorType.MODEL_API_ERROR and not info.value.recoverable
    assert "the Gemini API failed after 3 attempts: HTTP 503: down" == info.value.message and len(script.requests) == 3


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
def test_a_4xx_is_a_typed_fatal_error_asked_once(status):
    script = Script(httpx.Response(status, json={"error": {"message": "bad request: no such model"}}))
    with pytest.raises(OpenAgentsError) as info:
        client("openai", script).complete(MESSAGES, [])
    assert info.value.type == ErrorType.MODEL_API_ERROR and len(script.requests) == 1
    assert f"refused the request: HTTP {status}" in info.value.message and "no such model" in info.value.message


def test_a_4xx_while_streaming_reads_a_bounded_body():
    script = Script(httpx.Response(400, content=b"x" * (1 << 20)))
    with pytest.raises(OpenAgentsError) as info:
        client("openai", script, stream=True, retry=RetryPolicy(max_attempts=1)).complete(MESSAGES, [])
    assert info.value.type == ErrorType.MODEL_API_ERROR and len(info.value.message) < 1000


def test_a_malformed_body_is_tried_again_then_a_typed_error_that_shows_it():
    script = Script(*[httpx.Response(200, content=b"<html>gateway says hi</html>") for _ in range(3)])
    history = list(MESSAGES)
    with pytest.raises(OpenAgentsError) as info:
        client("openai", script).complete(history, [])
    assert info.value.type == ErrorType.MODEL_API_ERROR and len(script.requests) == 3
    assert "not JSON" in info.value.message and "gateway says hi" in info.value.message
    assert history == MESSAGES and [m.content for m in history] == ["s", "fix it"]  # nothing of the conversation lost


def test_a_malformed_body_then_a_good_one_loses_nothing():
    script = Script(
        httpx.Response(200, content=b"[1, 2"), httpx.Response(200, json=[1]), httpx.Response(200, json=WHOLE["openai"])
    )
    assert client("openai", script).complete(MESSAGES, []).text == "done" and len(script.requests) == 3


def test_a_json_answer_of_the_wrong_shape_is_typed_and_not_asked_again():
    script = Script(httpx.Response(200, json={"choices": "none"}))
    with pytest.raises(OpenAgentsError, match="unexpected shape") as info:
        client("openai", script).complete(MESSAGES, [])
    assert "'choices': 'none'" in info.value.message and len(script.requests) == 1


def test_a_stream_cut_midway_after_text_was_shown_is_a_typed_error_asked_once():
    raw = FakeModelServer.anthropic_events("partial answer")
    script = Script(
        httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=CutStream(raw[:4])), events(raw)
    )
    seen: list[str] = []
    with pytest.raises(OpenAgentsError) as info:
        client("anthropic", script, stream=True).complete(MESSAGES, [], on_text=seen.append)
    assert (
        info.value.type == ErrorType.MODEL_API_ERROR
        and "the stream broke off: RemoteProtocolError" in info.value.message
    )
    assert seen and "".join(seen) in "partial answer" and len(script.requests) == 1


def test_a_stream_cut_before_any_text_is_asked_again():
    raw = FakeModelServer.openai_events("whole")
    script = Script(
        httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=CutStream(raw[:1])), events(raw)
    )
    seen: list[str] = []
    assert client("openai", script, stream=True).complete(MESSAGES, [], on_text=seen.append).text == "whole"
    assert "".join(seen) == "whole" and len(script.requests) == 2  # said once


def test_a_server_that_ignores_stream_is_read_whole():
    script = Script(httpx.Response(200, json=WHOLE["gemini"]))
    assert client("gemini", script, stream=True).complete(MESSAGES, []).text == "done"
    assert str(script.requests[0].url).endswith(":streamGenerateContent?alt=sse")


def test_a_broken_connection_is_tried_again_and_a_read_timeout_is_not():
    script = Script(httpx.ConnectError("refused"), httpx.Response(200, json=WHOLE["openai"]))
    assert client("openai", script).complete(MESSAGES, []).text == "done" and len(script.requests) == 2
    script = Script(httpx.ReadTimeout("silent"), httpx.Response(200, json=WHOLE["openai"]))
    with pytest.raises(OpenAgentsError, match="--model-timeout"):
        client("openai", script).complete(MESSAGES, [])
    assert len(script.requests) == 1


def test_the_key_appears_in_its_header_only():
    script = Script(httpx.Response(401, json={"error": "bad key"}))
    with pytest.raises(OpenAgentsError) as info:
        client("anthropic", script, key="sk-ant-very-secret").complete(MESSAGES, [])
    assert (
        "sk-ant-very-secret" not in info.value.message
        and "sk-ant-very-secret" not in script.requests[0].content.decode()
    )
    assert script.requests[0].headers["x-api-key"] == "sk-ant-very-secret"


# -- a new family is one dialect --------------------------------------------------------------------
class Echo(Dialect):
    """A made-up family, whole in this class: one line per event, the answer's text under `say`."""

    family = "echo"
    what = "the Echo API"
    key_variable = "ECHO_KEY"

    def default_url(self) -> str:
        return os.environ.get("ECHO_BASE_URL", "http://echo.test")

    def url(self, base_url: str, model: str, stream: bool) -> str:
        return f"{base_url}/say/{model}" + ("?stream=1" if stream else "")

    def headers(self, key: str) -> dict[str, str]:
        return {"echo-key": key} if key else {}

    def request(self, model: str, messages: list[Message], tools: list[dict[str, Any]], stream: bool) -> dict[str, Any]:
        return {"lines": [m.content for m in messages], "tools": tools}

    def declare(self, name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
        return {"tool": name, "schema": parameters}

    def parse(self, data: dict[str, Any]) -> ModelTurn:
        try:
            return ModelTurn(
                text=str(data["say"]),
                tool_calls=[ToolCall(id="e0", name=c, arguments={}) for c in data.get("call", [])],
            )
        except KeyError as err:
            raise self.unexpected(err, data) from None

    def assembler(self, on_text: TextSink | None) -> Assembler:
        return EchoStream(self, on_text)


class EchoStream(Assembler):
    end_marker = "no end"

    def __init__(self, dialect: Dialect, on_text: TextSink | None) -> None:
        super().__init__(dialect, on_text)
        self.text: list[str] = []

    def feed(self, event: SSEEvent) -> None:
        self.text.append(str(self.data(event)["say"]))
        self.say(self.text[-1])
        self.finished = self.text[-1] == "b"

    def assembled(self) -> ModelTurn:
        return ModelTurn(text="".join(self.text))


@pytest.fixture
def echo_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(DIALECTS, "echo", Echo())


def test_a_new_family_is_one_dialect(echo_registered):
    """Registered (one entry), the family gets the tool declarations, the key variable for
    redaction, and the whole client (retries and streaming) with nothing else changed."""
    echo = DIALECTS["echo"]
    assert declarations(["read_file"], "echo")[0]["tool"] == "read_file" and key_variable("echo:m") == "ECHO_KEY"
    made = model_from_spec("echo:m", base_url="http://127.0.0.1:9")  # loopback: no key needed
    assert isinstance(made, HttpModelClient) and made.family == "echo"
    script = Script(
        httpx.Response(503),
        httpx.Response(200, json={"say": "hi", "call": ["read_file"]}),
        events([sse({"say": "a"}), sse({"say": "b"})]),
    )
    whole = HttpModelClient(
        echo, "m", "http://echo.test", "k", FAST, stream=False, transport=httpx.MockTransport(script)
    )
    turn = whole.complete(MESSAGES, declarations(["read_file"], "echo"))
    assert (
        whole.family == "echo"
        and turn.text == "hi"
        and turn.tool_calls[0].name == "read_file"
        and len(script.requests) == 2
    )
    assert script.requests[1].headers["echo-key"] == "k" and script.bodies()[1]["lines"] == ["s", "fix it"]
    seen: list[str] = []
    streamed = HttpModelClient(echo, "m", "http://echo.test", "k", FAST, transport=httpx.MockTransport(script))
    assert streamed.complete(MESSAGES, [], on_text=seen.append).text == "ab" and seen == ["a", "b"]
    assert str(script.requests[2].url) == "http://echo.test/say/m?stream=1"
