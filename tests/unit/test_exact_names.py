"""Structured listings are never parsed back from display text (issue 49). The agent gives list_files'
entries and grep_files' matches structured (meta `names`, `hits`: each name exact, sandbox_agent/
names.py), the API and the MCP server hand them on, and every name comes back usable: a following
read_file (list_files, grep_files) takes it. Names with a newline, a tab, bytes that are not UTF-8, a
`:1:` that looks like a match's line number, in real boxes. Before, a newline made two invented
entries and dropped the last real one, and a name that is not UTF-8 broke the agent's answer (the
host took the agent for lost and replaced the box)."""

from __future__ import annotations

import io
import json
import os
import sys

import pytest

from sandbox_agent import names, server

# -- the agent alone ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["a.txt", "nl\nname", "tab\tname", "bad\udcffutf8", "\x01" * 300, "ü/ß", 'q"\\', "\udc80" * 3]
)
def test_exact_round_trips_and_is_never_longer_than_base64(name):
    form = names.exact(name)
    assert names.from_arg(form) == name and names.from_arg(json.loads(json.dumps(form))) == name
    cost = len(json.dumps(form, ensure_ascii=False, separators=(",", ":")))
    assert cost <= 4 * ((len(os.fsencode(name)) + 2) // 3) + len('{"bytes_b64":""}')
    json.dumps(form, ensure_ascii=False).encode("utf-8")  # valid UTF-8, whatever the name


@pytest.mark.parametrize("bad", [{"bytes_b64": "!!"}, {"bytes_b64": 3}, {"bytes_b64": "YQ==", "x": 1}, ["a"], 5, None])
def test_a_path_in_neither_form_is_refused(bad):
    with pytest.raises(ValueError):
        names.from_arg(bad)


def test_every_answer_the_agent_sends_is_valid_utf8(monkeypatch):
    """A tool echoing a name that is not UTF-8 into its text (a note, an error, a listing's line) is
    answered in valid UTF-8, the name shown escaped; before, the raw byte made the line unreadable."""
    buffer = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", type("Out", (), {"buffer": buffer})())
    server._send(
        {
            "v": 1,
            "id": 1,
            "ok": False,
            "output": "bad\udcffutf8\nx\\xy",
            "error": {"type": "file_not_found", "message": "d\udcfe: no"},
            "meta": {"unreadable": ["u\udc80"], "names": [names.exact("bad\udcffutf8")]},
        }
    )
    line = buffer.getvalue()
    message = json.loads(line.decode("utf-8"))
    assert message["output"] == "bad\\xffutf8\nx\\xy" and message["error"]["message"] == "d\\xfe: no"
    assert (
        message["meta"]["unreadable"] == ["u\\x80"] and names.from_arg(message["meta"]["names"][0]) == "bad\udcffutf8"
    )
