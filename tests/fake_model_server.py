"""A real HTTP server on 127.0.0.1 that answers like the OpenAI Chat Completions API or Gemini's
generateContent, from a queue of scripted replies. It records every request it gets."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable


class FakeModelServer:
    def __init__(self) -> None:
        self.replies: list[tuple[int, dict[str, str], bytes]] = []
        self.requests: list[dict[str, Any]] = []
        self.before_reply: Callable[[int], None] | None = None  # called with the request's number (1-based) before it is answered
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("content-length", 0))
                raw = self.rfile.read(length)
                with server._lock:
                    server.requests.append({"path": self.path, "headers": dict(self.headers), "body": json.loads(raw or b"{}")})
                    number = len(server.requests)
                if server.before_reply is not None:
                    server.before_reply(number)
                with server._lock:
                    status, headers, body = server.replies.pop(0) if server.replies else (500, {}, b'{"error": "no scripted reply left"}')
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> "FakeModelServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    # -- scripting -------------------------------------------------------------------------
    def reply(self, body: dict | bytes, status: int = 200, headers: dict[str, str] | None = None) -> "FakeModelServer":
        self.replies.append((status, headers or {}, body if isinstance(body, bytes) else json.dumps(body).encode()))
        return self

    def openai_turn(self, text: str = "", tool_calls: list[tuple[str, str | dict]] | None = None) -> "FakeModelServer":
        """tool_calls: (name, arguments) with arguments a dict or raw (possibly broken) JSON text."""
        message: dict[str, Any] = {"role": "assistant", "content": text or None}
        if tool_calls:
            message["tool_calls"] = [
                {"id": f"call_{len(self.replies)}_{i}", "type": "function",
                 "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}
                for i, (name, args) in enumerate(tool_calls)
            ]
        return self.reply({"id": "chatcmpl-x", "object": "chat.completion", "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tool_calls else "stop"}]})

    def gemini_turn(self, text: str = "", function_calls: list[tuple[str, dict]] | None = None) -> "FakeModelServer":
        parts: list[dict] = [{"text": text}] if text else []
        parts += [{"functionCall": {"name": n, "args": a}} for n, a in function_calls or []]
        return self.reply({"candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP"}]})
