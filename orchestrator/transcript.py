"""The session transcript: JSONL, one event per line, written as it happens, so a crash keeps
everything up to the crash. Every outcome names its executor. Secrets are redacted on the way in.
"""
from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from sandbox_agent.shell import SECRET_NAME

from .protocol import Executor

REDACTED = "[REDACTED]"
_SECRET_PATTERNS = [
    re.compile(r"sk-[A-Za-z0-9_\-]{16,}"),
    re.compile(r"gh[pousr]_[A-Za-z0-9]{20,}"),
    re.compile(r"github_pat_[A-Za-z0-9_]{20,}"),
    re.compile(r"AIza[0-9A-Za-z_\-]{30,}"),
    re.compile(r"(?i)bearer\s+[A-Za-z0-9._\-]{16,}"),
]


class Redactor:
    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self.secrets = sorted({s for s in secrets if s and len(s) >= 6}, key=len, reverse=True)

    @classmethod
    def from_environment(cls, extra: Iterable[str] = ()) -> "Redactor":
        """Every host variable whose name looks secret, plus the model key in use."""
        return cls([v for k, v in os.environ.items() if SECRET_NAME.search(k)] + list(extra))

    def __call__(self, text: str) -> str:
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        for pattern in _SECRET_PATTERNS:
            text = pattern.sub(REDACTED, text)
        return text

    def deep(self, value: Any) -> Any:
        if isinstance(value, str):
            return self(value)
        if isinstance(value, dict):
            return {k: self.deep(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.deep(v) for v in value]
        return value


class Transcript:
    def __init__(self, path: str | Path | None, redactor: Redactor | None = None, on_event: Callable[[dict], None] | None = None) -> None:
        self.path = Path(path) if path else None
        self.redactor = redactor or Redactor.from_environment()
        self.on_event = on_event
        self._lock = threading.Lock()
        self._seq = 0
        self._fh = None
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.path, "a", encoding="utf-8")
        self.events: list[dict] = []

    def event(self, type: str, executor: Executor | None = None, **fields: Any) -> dict:
        with self._lock:
            self._seq += 1
            record = {"seq": self._seq, "ts": round(time.time(), 3), "type": type}
            if executor is not None:
                record["executor"] = executor.value
            record.update(self.redactor.deep(json.loads(json.dumps(fields, default=_jsonable))))
            self.events.append(record)
            if self._fh:
                self._fh.write(json.dumps(record, ensure_ascii=False) + "\n")
                self._fh.flush()
        if self.on_event:
            self.on_event(record)
        return record

    def close(self) -> None:
        with self._lock:
            if self._fh:
                self._fh.close()
                self._fh = None


def _jsonable(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if hasattr(value, "value"):
        return value.value
    return str(value)


def render_event(event: dict) -> str | None:
    """One line for a terminal; None for events not worth a line."""
    kind = event.get("type")
    who = f" [{event['executor']}]" if "executor" in event else ""
    if kind == "session_start":
        return f"● task: {event.get('task')}  (model {event.get('model')}, workspace {event.get('workspace')})"
    if kind == "model_response":
        text = (event.get("text") or "").strip()
        return f"◆ model: {text[:300]}" if text else None
    if kind == "tool_call" and event.get("state") == "validating":
        return f"→ {event.get('tool')} {json.dumps(event.get('arguments'), ensure_ascii=False)[:200]}"
    if kind == "approval":
        return f"  approval: {event.get('decision')} ({event.get('level')}){who}: {event.get('reason')}"
    if kind == "tool_result":
        status = "ok" if event.get("ok") else f"error {event.get('error', {}).get('type')}"
        preview = (event.get("output") or (event.get("error") or {}).get("message") or "").strip().splitlines()
        return f"  ← {status}{who}" + (f": {preview[0][:160]}" if preview else "")
    if kind == "egress":
        return f"  egress {event.get('decision')}{who}: {event.get('method') or ''} {event.get('host')}:{event.get('port')} ({event.get('reason')})"
    if kind == "session_end":
        return f"■ {event.get('status')}{who}: {event.get('reason')}"
    return None


def show(path: str | Path) -> Iterable[str]:
    redactor = Redactor.from_environment()
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            try:
                event = json.loads(line)
            except ValueError:
                yield f"(unreadable line: {line[:80]!r})"
                continue
            rendered = render_event(redactor.deep(event))
            if rendered:
                yield rendered
