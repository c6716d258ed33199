"""A real HTTP server on 127.0.0.1 that answers like the OpenAI Chat Completions API, Gemini's
generateContent / streamGenerateContent or Anthropic's Messages API, from a queue of scripted
replies, streamed (server-sent events, written piece by piece) or whole. It records every request."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable


class Reply:
    def __init__(
        self, status: int, headers: dict[str, str], body: bytes | list[bytes], delay_s: float = 0.0, hang_s: float = 0.0
    ) -> None:
        self.status, self.headers, self.body, self.delay_s, self.hang_s = status, headers, body, delay_s, hang_s


def sse(data: Any, event: str | None = None) -> bytes:
    """One server-sent event: `data` as JSON (or as given, for bytes)."""
    raw = data if isinstance(data, bytes) else json.dumps(data).encode()
    return (f"event: {event}\n".encode() if event else b"") + b"data: " + raw + b"\n\n"


class FakeModelServer:
    def __init__(self) -> None:
        self.replies: list[Reply] = []
        self.requests: list[dict[str, Any]] = []
        self.before_reply: Callable[[int], None] | None = (
            None  # called with the request's number (1-based) before it is answered
        )
        self._lock = threading.Lock()
        self._closing = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("content-length", 0))
                raw = self.rfile.read(length)
                with server._lock:
                    server.requests.append(
                        {
                            "path": self.path,
                            "headers": dict(self.headers),
                            "body": json.loads(raw or b"{}"),
                            "at": time.monotonic(),
                        }
                    )
                    number = len(server.requests)
                if server.before_reply is not None:
                    server.before_reply(number)
                with server._lock:
                    reply = (
                        server.replies.pop(0)
                        if server.replies
                        else Reply(500, {}, b'{"error": "no scripted reply left"}')
                    )
                if reply.hang_s:  # a server that took the request and says nothing
                    server._closing.wait(reply.hang_s)
                    return
                self.send_response(reply.status)
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                if isinstance(reply.body, list):
                    self.send_header("content-type", "text/event-stream")
                    self.send_header("cache-control", "no-cache")
                    self.end_headers()
                    for piece in reply.body:
                        self.wfile.write(piece)
                        self.wfile.flush()
                        if reply.delay_s:
                            time.sleep(reply.delay_s)
                    return
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(reply.body)))
                self.end_headers()
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                self.wfile.write(reply.body)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "FakeModelServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._closing.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    # -- scripting -------------------------------------------------------------------------
    def reply(
        self, body: dict | bytes, status: int = 200, headers: dict[str, str] | None = None, delay_s: float = 0.0
    ) -> "FakeModelServer":
        self.replies.append(
            Reply(status, headers or {}, body if isinstance(body, bytes) else json.dumps(body).encode(), delay_s)
        )
        return self

    def stream(self, events: list[bytes], pieces: int | None = None, delay_s: float = 0.0) -> "FakeModelServer":
        """A text/event-stream body; `pieces` cuts it into writes of that many bytes (a line, an event,
        even a CRLF split across reads), each flushed, `delay_s` apart."""
        body = b"".join(events)
        chunks = [body[i : i + pieces] for i in range(0, len(body), pieces)] if pieces else list(events)
        self.replies.append(Reply(200, {}, chunks, delay_s))
        return self

    def hang(self, seconds: float = 30.0) -> "FakeModelServer":
        self.replies.append(Reply(200, {}, b"", hang_s=seconds))
        return self

    def openai_turn(self, text: str = "", tool_calls: list[tuple[str, str | dict]] | None = None) -> "FakeModelServer":
        """tool_calls: (name, arguments) with arguments a dict or raw (possibly broken) JSON text."""
        message: dict[str, Any] = {"role": "assistant", "content": text or None}
        if tool_calls:
            message["tool_calls"] = [
                {
                    "id": f"call_{len(self.replies)}_{i}",
                    "type": "function",
                    "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)},
                }
                for i, (name, args) in enumerate(tool_calls)
            ]
        return self.reply(
            {
                "id": "chatcmpl-x",
                "object": "chat.completion",
                "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tool_calls else "stop"}],
            }
        )

    @staticmethod
    def openai_events(
        text: str = "", tool_calls: list[tuple[str, str | dict]] | None = None, split: int = 3
    ) -> list[bytes]:
        """Chat completion chunks: the text `split` characters a chunk, each call's id and name first,
        then its arguments' JSON text in pieces; a usage chunk (empty choices); [DONE]."""

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            return sse(
                {
                    "id": "chatcmpl-x",
                    "object": "chat.completion.chunk",
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                }
            )

        out = [chunk({"role": "assistant", "content": ""})]
        out += [chunk({"content": text[i : i + split]}) for i in range(0, len(text), split)]
        for i, (name, args) in enumerate(tool_calls or []):
            raw = args if isinstance(args, str) else json.dumps(args)
            out.append(
                chunk(
                    {
                        "tool_calls": [
                            {
                                "index": i,
                                "id": f"call_s{i}",
                                "type": "function",
                                "function": {"name": name, "arguments": ""},
                            }
                        ]
                    }
                )
            )
            out += [
                chunk({"tool_calls": [{"index": i, "function": {"arguments": raw[j : j + split]}}]})
                for j in range(0, len(raw), split)
            ]
        out.append(chunk({}, "tool_calls" if tool_calls else "stop"))
        out.append(
            sse(
                {
                    "id": "chatcmpl-x",
                    "object": "chat.completion.chunk",
                    "choices": [],
                    "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
                }
            )
        )
        out.append(b"data: [DONE]\n\n")
        return out

    def openai_stream(
        self,
        text: str = "",
        tool_calls: list[tuple[str, str | dict]] | None = None,
        pieces: int | None = None,
        delay_s: float = 0.0,
    ) -> "FakeModelServer":
        return self.stream(self.openai_events(text, tool_calls), pieces, delay_s)

    def gemini_turn(self, text: str = "", function_calls: list[tuple[str, dict]] | None = None) -> "FakeModelServer":
        parts: list[dict] = [{"text": text}] if text else []
        parts += [{"functionCall": {"name": n, "args": a}} for n, a in function_calls or []]
        return self.reply({"candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP"}]})

    def gemini_stream(
        self,
        text: str = "",
        function_calls: list[tuple[str, dict]] | None = None,
        split: int = 3,
        pieces: int | None = None,
        delay_s: float = 0.0,
    ) -> "FakeModelServer":
        """streamGenerateContent?alt=sse: each event a GenerateContentResponse; the last with
        finishReason and the usage; no [DONE]."""

        def response(parts: list[dict], last: bool = False) -> bytes:
            candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
            body: dict[str, Any] = {"candidates": [candidate]}
            if last:
                candidate["finishReason"] = "STOP"
                body["usageMetadata"] = {"promptTokenCount": 13, "candidatesTokenCount": 5, "totalTokenCount": 18}
            return sse(body)

        events = [response([{"text": text[i : i + split]}]) for i in range(0, len(text), split)]
        events.append(response([{"functionCall": {"name": n, "args": a}} for n, a in function_calls or []], last=True))
        return self.stream(events, pieces, delay_s)

    def anthropic_turn(self, text: str = "", tool_uses: list[tuple[str, dict]] | None = None) -> "FakeModelServer":
        content: list[dict] = [{"type": "text", "text": text}] if text else []
        content += [
            {"type": "tool_use", "id": f"toolu_{i}", "name": n, "input": a} for i, (n, a) in enumerate(tool_uses or [])
        ]
        return self.reply(
            {
                "id": "msg_x",
                "type": "message",
                "role": "assistant",
                "model": "claude-test",
                "content": content,
                "stop_reason": "tool_use" if tool_uses else "end_turn",
                "usage": {"input_tokens": 21, "output_tokens": 9},
            }
        )

    @staticmethod
    def anthropic_events(
        text: str = "", tool_uses: list[tuple[str, str | dict]] | None = None, split: int = 3
    ) -> list[bytes]:
        """The Messages API's event stream, as documented: message_start, per block a start, deltas
        (text_delta; input_json_delta with partial_json) and a stop, message_delta, message_stop."""
        out = [
            sse(
                {
                    "type": "message_start",
                    "message": {
                        "id": "msg_x",
                        "type": "message",
                        "role": "assistant",
                        "content": [],
                        "model": "claude-test",
                        "stop_reason": None,
                        "usage": {"input_tokens": 21, "output_tokens": 1},
                    },
                },
                "message_start",
            ),
            sse({"type": "ping"}, "ping"),
        ]
        index = 0
        if text:
            out.append(
                sse(
                    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                    "content_block_start",
                )
            )
            out += [
                sse(
                    {
                        "type": "content_block_delta",
                        "index": 0,
                        "delta": {"type": "text_delta", "text": text[i : i + split]},
                    },
                    "content_block_delta",
                )
                for i in range(0, len(text), split)
            ]
            out.append(sse({"type": "content_block_stop", "index": 0}, "content_block_stop"))
            index = 1
        for k, (name, args) in enumerate(tool_uses or []):
            raw = args if isinstance(args, str) else json.dumps(args)
            at = index + k
            out.append(
                sse(
                    {
                        "type": "content_block_start",
                        "index": at,
                        "content_block": {"type": "tool_use", "id": f"toolu_s{k}", "name": name, "input": {}},
                    },
                    "content_block_start",
                )
            )
            out += [
                sse(
                    {
                        "type": "content_block_delta",
                        "index": at,
                        "delta": {"type": "input_json_delta", "partial_json": raw[j : j + split]},
                    },
                    "content_block_delta",
                )
                for j in range(0, len(raw), split)
            ]
            out.append(sse({"type": "content_block_stop", "index": at}, "content_block_stop"))
        out.append(
            sse(
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "tool_use" if tool_uses else "end_turn", "stop_sequence": None},
                    "usage": {"output_tokens": 9},
                },
                "message_delta",
            )
        )
        out.append(sse({"type": "message_stop"}, "message_stop"))
        return out

    def anthropic_stream(
        self,
        text: str = "",
        tool_uses: list[tuple[str, str | dict]] | None = None,
        pieces: int | None = None,
        delay_s: float = 0.0,
    ) -> "FakeModelServer":
        return self.stream(self.anthropic_events(text, tool_uses), pieces, delay_s)
