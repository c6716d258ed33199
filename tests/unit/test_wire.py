"""sandbox_agent.wire is json.loads / json.dumps(ensure_ascii=False, separators=(",", ":")) without
the json package: the same value for every input json accepts, json's own error for every other."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys

import pytest

from sandbox_agent import wire

VALUES = [
    {},
    [],
    "",
    0,
    -1,
    10**40,
    1.5,
    -0.0,
    1e-300,
    1e300,
    True,
    False,
    None,
    {"v": 1, "id": 7, "tool": "read_file", "args": {"path": "a/b.txt", "offset": 3}},
    {"text": 'naïve ☃ 𝄞 \u0000 \x1f \\ " / \u2028 \ud800 \udcff', "nested": [[{"a": [1, [2, {"b": None}]]}]]},
    ["\n\r\t", {"": ""}, [1.0, 2.25, float("inf"), float("-inf")]],
]

TEXTS = [
    "",
    " ",
    "1",
    " 1 ",
    "\t{}\n",
    "[1,2",
    "[1,2]]",
    '{"a":1,}',
    "{'a':1}",
    "nul",
    "NaN",
    "-Infinity",
    "[NaN,Infinity]",
    "\ufeff{}",
    "{}\ufeff",
    "1 2",
    '"\\ud800"',
    '"\\x"',
    '"tab\there"',
    "01",
    "-",
    "1e",
    "[" * 10 + "]" * 10,
    '{"a":1,"a":2}',
    '"\\u00e9"',
    '  [ 1 , { "k" : [ ] } ]  ',
    "\u3000[]",
    "[]\x0b",
    "true false",
]


def outcome(fn, arg):
    try:
        value = fn(arg)
    except Exception as err:  # noqa: BLE001 - the error is what is compared
        return ("error", type(err), str(err))
    return (
        "value",
        repr(value) if isinstance(value, float) and math.isnan(value) else json.dumps(value, sort_keys=True),
    )


@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
def test_encode_is_jsons_dumps(value):
    assert wire.encode(value) == json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    assert outcome(wire.decode, wire.encode(value)) == outcome(json.loads, json.dumps(value, ensure_ascii=False))


@pytest.mark.parametrize("text", TEXTS, ids=range(len(TEXTS)))
def test_decode_is_jsons_loads_value_or_error(text):
    assert outcome(wire.decode, text) == outcome(json.loads, text)


def test_mutated_messages_decode_as_json_does():
    """Random cuts, insertions and swaps of real messages: value or error, the same as json.loads."""
    rng = random.Random(26)
    seeds = [json.dumps(v, ensure_ascii=False) for v in VALUES]
    alphabet = list('{}[]",:\\ \t\n0123456789.eE+-truefalsn') + ["\u00e9", "\ud800", "\ufeff"]
    for _ in range(3000):
        text = list(rng.choice(seeds))
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(text) + 1)
            match rng.randrange(3):
                case 0:
                    text.insert(at, rng.choice(alphabet))
                case 1 if text:
                    del text[min(at, len(text) - 1)]
                case _:
                    text[at:at] = text[: rng.randrange(len(text) + 1)]
        mutated = "".join(text)
        assert outcome(wire.decode, mutated) == outcome(json.loads, mutated), mutated


def test_values_json_cannot_encode_fail_as_json_fails():
    for bad in ({"a": object()}, {1j: 1}, [b"bytes"], {("t",): 1}):
        assert (
            outcome(wire.encode, bad)[:2]
            == outcome(lambda v: json.dumps(v, ensure_ascii=False, separators=(",", ":")), bad)[:2]
        )
    circular: list = []
    circular.append(circular)
    assert outcome(wire.encode, circular) == outcome(json.dumps, circular)


def test_a_failed_encode_leaves_nothing_behind_for_the_next():
    """The C encoder's circular-reference markers keep what a failed encode entered: shared between
    messages, the same dict sent again after a failure would be called circular (and held forever)."""
    meta = {"ok": [1, 2], "bad": object()}
    message = {"meta": meta}
    with pytest.raises(TypeError):
        wire.encode(message)
    del meta["bad"]
    assert wire.encode(message) == '{"meta":{"ok":[1,2]}}'


def test_without_the_accelerator_it_is_the_json_package(monkeypatch):
    monkeypatch.setattr(wire, "_scan", None)
    monkeypatch.setattr(wire, "_new_encoder", None)
    for text in TEXTS:
        assert outcome(wire.decode, text) == outcome(json.loads, text)
    for value in VALUES:
        assert wire.encode(value) == json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def test_the_agent_answers_without_importing_the_json_package_or_re():
    """What the start saves (issue 26): the agent's hello and first read load none
    of json, re, enum, collections, signal's wrapper, queue, subprocess, typing."""
    code = (
        # what this interpreter's threading loads is not the agent's
        "import os, sys, threading; before = set(sys.modules); sys.path.insert(0, '.'); "
        "import sandbox_agent.server as s, sandbox_agent.reading; s.handle({'v': 1, 'id': 1, "
        "'tool': 'hello'}); s.jsonbound.loads(b'{\"v\":1}'); s.wire.encode({'a': [1]}); "
        "print(sorted(m for m in ('json', 're', 'enum', 'collections', 'signal', 'importlib', "
        "'queue', 'subprocess', 'typing') if m in sys.modules and m not in before))"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=str(__import__("pathlib").Path(__file__).parents[2]),
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
