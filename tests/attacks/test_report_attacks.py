"""The session report (`oa-sandbox report`) of a hostile session: the box and the model wrote file
names, outputs, diffs and answers made to break out of HTML. The page is rendered from a real
session (`oa-sandbox run`, a scripted model, a real container) and opened in a real headless
Chromium: no script runs, nothing is fetched (a loopback server records any request), and the
hostile text is on the page as text."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from orchestrator.report import MAX_PAGE_BYTES
from tests.helpers import chown_tree, make_workspace
from tests.helpers.report_browser import Elements, Recorder, dump_dom, needs_chromium, run_cli, run_session

# The page's own elements (and the tbody a browser adds): anything else in it came from the session.
PAGE_TAGS = {
    "html",
    "head",
    "meta",
    "title",
    "style",
    "body",
    "header",
    "h1",
    "h2",
    "h4",
    "p",
    "strong",
    "div",
    "ul",
    "ol",
    "li",
    "nav",
    "a",
    "main",
    "section",
    "table",
    "tbody",
    "tr",
    "th",
    "td",
    "pre",
    "code",
    "details",
    "summary",
    "span",
    "br",
}
POLICY = (
    "rules:\n  - {id: edits, kind: edit, decision: allow}\n  - {id: "
    "hostile, tool: shell, command_prefix: sh hostile.sh, decision: allow}\n"
)


def payloads(port: int) -> list[str]:
    """Each would change the title, run a handler or fetch from the recorder if the page interpreted it."""
    remote = f"http://127.0.0.1:{port}"
    return [
        "<script>document.title='PWNED-script'</script>",
        '"><img src=x onerror="document.title=\'PWNED-img\'">',
        "'><svg onload=\"document.title='PWNED-svg'\">",
        "<a href=\"javascript:document.title='PWNED-js'\">javascript:document.title='PWNED-js'</a>",
        "</details></pre></li></ol></section><script>document.title='PWNED-details'</script>",
        "</style><script>document.title='PWNED-style'</script><style>body{background:url(" + remote + "/style-url)}",
        "</title><script>document.title='PWNED-title'</script>",
        f'<img src="{remote}/img"><link rel=stylesheet href="{remote}/css"><iframe src="{remote}/frame"></iframe>',
        f'<meta http-equiv="refresh" content="0;url={remote}/refresh"><base href="{remote}/">',
        "<!-- --><plaintext>",
        "\x1b]0;evil-title\x07\x1b[31mred\x1b[0m \u202ebidi\u202c \x00nul \x7fdel \u2028sep",
    ]


HOSTILE_SH = r"""
set -- "$(cat payload.txt)"
printf '%s\n' "$1"
printf '\033]0;evil\007\033[2J\033[31mred \302\233 \342\200\256 bidi \377\376 invalid utf8\n'
head -c 10485760 /dev/zero | tr '\0' 'A'; echo
printf '%s' "$1" > "$(printf 'ctl\033[31m\001name.txt')"
printf 'x' > "$(printf 'bad\377utf8.txt')"
printf '%s' "$1" > '<details><summary onclick=document.title=`PWNED-summary`>.txt'
mkdir -p 'dir"><img src=x onerror=document.title=`PWNED-dir`>'
printf '%s' "$1" > 'dir"><img src=x onerror=document.title=`PWNED-dir`>/javascript:alert(1)'
ln -s /etc/passwd 'link"><svg onload=document.title=`PWNED-link`>'
mkfifo 'fifo<script>document.title=`PWNED-fifo`'
"""


@pytest.fixture(scope="module")
def hostile(tmp_path_factory, sandbox_image):
    """A copy session whose box and model wrote every payload, its report, and the recorder."""
    tmp = tmp_path_factory.mktemp("report")
    recorder = Recorder()
    every = "\n".join(payloads(recorder.port))
    text = every.replace("\x00", "")  # files with a NUL are summarised as binary, not diffed: these are diffed
    ws = make_workspace(tmp / "ws", {"app.py": "print('hi')\n"})
    chown_tree(ws)
    turns = [
        {
            "text": every,
            "tool_calls": [
                {"name": "write_file", "arguments": {"path": "hostile.sh", "content": HOSTILE_SH}},
                {"name": "write_file", "arguments": {"path": "payload.txt", "content": text}},
                {
                    "name": "write_file",
                    "arguments": {"path": "\"><img src=x onerror=document.title='PWNED-name'>.txt", "content": text},
                },
                {
                    "name": "edit_file",
                    "arguments": {
                        "path": "app.py",
                        "old_text": "print('hi')",
                        "new_text": "print('hi')\n# " + text.replace("\n", " "),
                    },
                },
            ],
        },
        {"text": "running it " + every, "tool_calls": [{"name": "shell", "arguments": {"command": "sh hostile.sh"}}]},
        {
            "text": "a call the policy refuses",
            "tool_calls": [{"name": "shell", "arguments": {"command": f"curl '{every[:200]}'"}}],
        },
        {"text": "done " + every},
    ]
    sid, proc = run_session(tmp, ws, turns, POLICY, "the task " + every.replace("\x00", ""), "--workspace-mode", "copy")
    assert proc.returncode in (0, 3), proc.stderr[-3000:]
    out = tmp / "report.html"
    done = run_cli("report", sid, "-o", str(out), state=tmp / "state")
    assert done.returncode == 0, done.stderr[-3000:]
    yield sid, out, recorder, tmp
    recorder.close()


def test_report_of_hostile_session_holds_no_element_of_the_box(hostile):
    """A report of a session whose file names, outputs, diffs and model text carry <script>, event
    handlers, javascript: links, </details>, </style>, control characters and invalid UTF-8 holds only
    the page's own elements, no handler and no link out; every payload is there as escaped text."""
    sid, out, recorder, _ = hostile
    page = out.read_text(encoding="utf-8")
    assert len(page.encode()) <= MAX_PAGE_BYTES
    elements = Elements(page)
    assert {tag for tag, _ in elements.tags} <= PAGE_TAGS, {tag for tag, _ in elements.tags} - PAGE_TAGS
    for tag, attrs in elements.tags:
        assert not [
            a
            for a in attrs
            if a.startswith("on") or a in ("src", "srcset", "style", "action", "formaction", "background")
        ], (tag, attrs)
        assert attrs.get("href") is None or attrs["href"].startswith("#"), (tag, attrs)
    metas = [attrs for tag, attrs in elements.tags if tag == "meta" and attrs.get("http-equiv")]
    assert (
        len(metas) == 1
        and metas[0]["http-equiv"] == "Content-Security-Policy"
        and "default-src 'none'" in (metas[0]["content"] or "")
    )
    assert "script-src" in (metas[0]["content"] or "") and "unsafe" not in (metas[0]["content"] or "")
    assert elements.title == f"oa-sandbox report: session {sid}"
    assert "&lt;script&gt;document.title=&#39;PWNED-script&#39;&lt;/script&gt;" in page  # shown, as text
    assert "onerror=document.title=&#39;PWNED-name&#39;" in page  # the file name, in the timeline and the diff
    assert "\x1b" not in page and "\x00" not in page and "\u202e" not in page and "\x07" not in page
    assert "\\x1b]0;evil" in page  # the control sequence, made visible
    assert "AAAAAAAA" in page and "fifo" in page and "left out" in page.lower()


@needs_chromium
def test_report_of_hostile_session_runs_nothing_and_loads_nothing_in_chromium(hostile):
    """The hostile session's report opened in a real headless Chromium: no payload ran (the
    title is the page's, no element of the box's is in the DOM), nothing was fetched from a
    loopback server every payload points at, and the payloads are on the page as text."""
    sid, out, recorder, _ = hostile
    dom = dump_dom(out)
    elements = Elements(dom)
    assert elements.title == f"oa-sandbox report: session {sid}", elements.title
    assert {tag for tag, _ in elements.tags} <= PAGE_TAGS
    assert "PWNED" not in elements.title and not any(a.startswith("on") for _, attrs in elements.tags for a in attrs)
    assert "document.title='PWNED-script'" in dom.replace("&#39;", "'") or "document.title='PWNED-script'" in dom
    assert recorder.requests == []


@needs_chromium
def test_report_csp_stops_what_escaping_would_miss(hostile, tmp_path):
    """Defence in depth: markup planted into the report's body unescaped (a script, an
    image with a handler, a remote stylesheet, a style url) neither runs nor loads, because
    of the page's Content-Security-Policy alone; the same page without it does both."""
    sid, out, recorder, _ = hostile
    page = out.read_text(encoding="utf-8")
    remote = f"http://127.0.0.1:{recorder.port}"
    planted = (
        "<script>document.title='PWNED-csp'</script><img "
        f'src="{remote}/csp-img" onerror="document.title=\'PWNED-csp-img\'">'
        f'<link rel=stylesheet href="{remote}/csp-css"><div style="background:url({remote}/csp-style)">x</div>'
    )
    with_csp = tmp_path / "with-csp.html"
    with_csp.write_text(page.replace("</main>", planted + "</main>"), encoding="utf-8")
    before = len(recorder.requests)
    assert Elements(dump_dom(with_csp)).title == f"oa-sandbox report: session {sid}"
    assert recorder.requests[before:] == []
    # The control: the same planting on the page without its CSP does run and load, so the check above can see it.
    start = page.index("<meta http-equiv")
    without = tmp_path / "without-csp.html"
    without.write_text(
        page[:start] + page[page.index(">", start) + 1 :].replace("</main>", planted + "</main>"), encoding="utf-8"
    )
    assert Elements(dump_dom(without)).title.startswith("PWNED-csp")
    assert recorder.requests[before:], "the control page made no request: the recorder cannot see one"
    del recorder.requests[before:]


@pytest.mark.slow  # writing 200 MiB and reading it back: about 35 s here
@needs_chromium
def test_report_of_a_huge_transcript_is_bounded_and_renders_fast(hostile, tmp_path):
    """A session whose transcript grew to 200 MiB (tens of thousands of big tool
    results): the report is built in seconds, stays under its cap, says what it
    left out and where the full record is, and Chromium renders it in seconds."""
    sid, _, _, tmp = hostile
    record = json.loads((tmp / "state" / "openagents-sandbox" / "sessions" / sid / "session.json").read_text())
    transcript = Path(record["transcript"])
    lines = transcript.read_text(encoding="utf-8").splitlines()
    results = [
        json.loads(line)
        for line in lines
        if json.loads(line)["type"] in ("tool_call", "approval", "tool_result", "model_response")
    ]
    ending = [line for line in lines if json.loads(line)["type"] == "session_end"]
    body = [line for line in lines if json.loads(line)["type"] != "session_end"]
    # Each round the same records under new call ids: serialised once, the id put in by replace.
    rounds = "".join(json.dumps({**event, "call_id": f"{event.get('call_id', '')}-@N@"}) + "\n" for event in results)
    with transcript.open("w", encoding="utf-8") as fh:
        fh.write("\n".join(body) + "\n")
        written, n = 0, 0
        while written < 200 << 20:
            n += 1
            chunk = rounds.replace("-@N@", f"-{n}")
            fh.write(chunk)
            written += len(chunk)
        fh.write("\n".join(ending) + "\n")
    out = tmp_path / "huge.html"
    started = time.monotonic()
    done = run_cli("report", sid, "-o", str(out), state=tmp / "state")
    built = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-3000:]
    page = out.read_text(encoding="utf-8")
    assert len(page.encode()) <= MAX_PAGE_BYTES
    assert "Left out of this page" in page and "timeline entries past the first" in page and str(transcript) in page
    assert "finished" in page  # the session's end, past all the bulk, was still read
    assert built < 60, f"the report took {built:.1f} s"
    started = time.monotonic()
    dom = dump_dom(out, budget_ms=500)
    assert time.monotonic() - started < 20 and f"oa-sandbox report: session {sid}" in dom
