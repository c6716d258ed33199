"""For the report tests: real sessions run by `oa-sandbox run` with a scripted model, their pages
opened in a real headless Chromium (Debian's package, scripts/setup --extras installs it for scripts/test),
a loopback HTTP server that records every request a page makes, and an HTML parser listing every element."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from html.parser import HTMLParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

OA = os.path.join(os.path.dirname(sys.executable), "oa-sandbox")
CHROMIUM = shutil.which("chromium")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (scripts/setup --extras installs it)"
)


def run_cli(
    *args: str, state: Path, timeout: int = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **(env or {}), "XDG_STATE_HOME": str(state)}
    return subprocess.run(
        [OA, *args], capture_output=True, text=True, env=env, timeout=timeout, stdin=subprocess.DEVNULL
    )


def run_session(
    tmp: Path, ws: Path, turns: list[dict], policy: str, task: str, *extra: str
) -> tuple[str, subprocess.CompletedProcess[str]]:
    """Runs `oa-sandbox run` with `turns` as its scripted model; the session's id and the process."""
    script = tmp / "model.jsonl"
    script.write_text("".join(json.dumps(t) + "\n" for t in turns))
    policy_file = tmp / "policy.yaml"
    policy_file.write_text(policy)
    proc = run_cli(
        "run",
        "--workspace",
        str(ws),
        "--model",
        f"script:{script}",
        "--non-interactive",
        "--policy",
        str(policy_file),
        *extra,
        task,
        state=tmp / "state",
    )
    found = re.search(r"session: ([0-9]{8}-[0-9]{6}-[0-9a-f]{6})", proc.stderr)
    assert found, proc.stderr[-3000:]
    return found.group(1), proc


def chromium(page: Path, *args: str, timeout: int = 120) -> subprocess.CompletedProcess[str]:
    """Headless Chromium on `page` (a file:// URL), its own throwaway profile, nothing in the background."""
    assert CHROMIUM is not None
    with tempfile.TemporaryDirectory() as profile:
        cmd = [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-extensions",
            "--disable-sync",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-default-apps",
            "--mute-audio",
            f"--user-data-dir={profile}",
            *args,
            page.resolve().as_uri(),
        ]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def dump_dom(page: Path, budget_ms: int = 3000) -> str:
    """The DOM after the page loaded and `budget_ms` of (virtual) time passed: any script or handler has run by then."""
    proc = chromium(page, f"--virtual-time-budget={budget_ms}", "--dump-dom")
    assert proc.returncode == 0 and "<html" in proc.stdout, proc.stderr[-2000:]
    return proc.stdout


class Elements(HTMLParser):
    """Every start tag with its attributes, and the text of <title>."""

    def __init__(self, page: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.title = ""
        self._in_title = False
        self.feed(page)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in_title = tag == "title"

    def handle_endtag(self, tag: str) -> None:
        self._in_title = False

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data


class Recorder:
    """A loopback HTTP server that answers 200 to anything and records each path asked for."""

    def __init__(self) -> None:
        seen: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                seen.append(self.path)
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                self.wfile.write(b"x")

            def log_message(self, *args: object) -> None:
                pass

        self.requests = seen
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
