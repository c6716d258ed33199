"""What tests/box/test_acp.py shares with other tests, kept here
(issue 48: helpers in one place, none imported from a test module)."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time

from orchestrator.acp import models as m

OA = os.path.join(os.path.dirname(sys.executable), "oa-sandbox")


class Editor:
    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [OA, "acp", *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None  # both piped, above
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        self.inbox: queue.Queue = queue.Queue()
        self.notifications: list[dict] = []
        self.permission_requests: list[dict] = []
        self.answer = lambda params: {"outcome": {"outcome": "selected", "optionId": "allow_once"}}
        self.on_notification = lambda note: None
        self._ids = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.stdout:
            self.inbox.put(json.loads(line))

    def send(self, message: dict) -> None:
        self.stdin.write(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")
        self.stdin.flush()

    def send_raw(self, raw: bytes) -> None:
        self.stdin.write(raw + b"\n")
        self.stdin.flush()

    def call(self, method: str, params: dict, timeout: float = 120) -> dict:
        self._ids += 1
        rid = self._ids
        self.send({"id": rid, "method": method, "params": params})
        return self.wait_for(rid, timeout)

    def wait_for(self, rid, timeout: float = 120) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = self.inbox.get(timeout=deadline - time.monotonic())
            if msg.get("method") == "session/update":
                m.SessionNotification.model_validate(msg["params"])  # every notification fits the model
                self.notifications.append(msg["params"])
                self.on_notification(msg["params"])
            elif msg.get("method") == "session/request_permission":
                params = m.RequestPermissionParams.model_validate(msg["params"])
                self.permission_requests.append(msg["params"])
                assert [o.kind for o in params.options] == ["allow_once", "reject_once"]
                self.send({"id": msg["id"], "result": self.answer(msg["params"])})
            elif msg.get("id") == rid:
                return msg
        raise TimeoutError(f"no answer to {rid}")

    def close(self) -> None:
        self.stdin.close()
        self.proc.wait(timeout=60)


def updates(editor: Editor, kind: str) -> list[dict]:
    return [n["update"] for n in editor.notifications if n["update"]["sessionUpdate"] == kind]
