"""Policy bytes to plain data (dicts, lists, strings, numbers, booleans), bounded in every dimension.

A workspace policy is written by the box, so its parse is an attack surface: a YAML alias bomb
expands 500 bytes into billions of nodes; deep nesting recurses; pure-Python parsers have inputs
that cost seconds per 64 KiB (tomllib on 30,000-part dotted keys or table headers, PyYAML on long
flow sequences, measured at 1.5 to 2.5 s here). So: aliases and anchors are refused while
composing (no expansion ever starts), nesting and node counts are bounded, and for an untrusted
file the whole parse runs in a child process with CPU, memory and wall-clock limits, killed when
it takes too long. The child is this file run with `python -I`; it imports nothing of ours.

Every refusal's message is ours: it names the problem and a position, never the file's content
(parsers' own messages quote the input).
"""

from __future__ import annotations

import json
import os
import re
import sys
import tomllib
from typing import Any

import yaml

MAX_DEPTH = 32  # nesting levels; a real policy has four
MAX_NODES = 10_000  # YAML nodes; a real policy has a few hundred
PARSE_SECONDS = 2.0  # wall clock for an untrusted parse; the slowest input we built takes ~0.6 s alone
START_SECONDS = 30.0  # for the child's interpreter and imports, before the parse's clock starts
_CHILD_MEMORY = 512 * 1024 * 1024


class Refused(Exception):
    """A parse refused; its message is ours and carries none of the input."""


class StrictYamlLoader(yaml.SafeLoader):
    """SafeLoader without aliases or anchors, with bounded nesting and node count."""

    depth = 0
    nodes = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()  # type: ignore[no-untyped-call]  # types-PyYAML leaves Parser.peek_event unannotated
        line = event.start_mark.line + 1
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise Refused(f"YAML aliases and anchors are refused (line {line})")
        self.depth += 1
        self.nodes += 1
        if self.depth > MAX_DEPTH:
            raise Refused(f"nested deeper than {MAX_DEPTH} levels (line {line})")
        if self.nodes > MAX_NODES:
            raise Refused(f"more than {MAX_NODES} YAML nodes (line {line})")
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def _check_plain(data: Any) -> None:
    """Only JSON's types survive (the child hands data back as JSON), nesting bounded; iterative,
    so checking a deep structure cannot recurse either."""
    stack = [(data, 0)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise Refused(f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(value, dict):
            if not all(isinstance(key, str) for key in value):
                raise Refused("every key must be a string")
            stack.extend((child, depth + 1) for child in value.values())
        elif isinstance(value, list):
            stack.extend((child, depth + 1) for child in value)
        elif isinstance(value, int) and value.bit_length() > 64:
            raise Refused("an integer larger than 64 bits is not allowed in a policy")
        elif value is not None and not isinstance(value, (str, bool, int, float)):
            raise Refused(f"a value of type {type(value).__name__} is not allowed in a policy")


def parse_data(raw: bytes, suffix: str) -> Any:
    """Parse in this process: for the user's and admin's own files (trusted, still bounded)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise Refused(f"not UTF-8 (byte {err.start})") from None
    try:
        if suffix == ".toml":
            data = tomllib.loads(text)
        else:
            loader = StrictYamlLoader(text)
            try:
                data = loader.get_single_data()
            finally:
                loader.dispose()
    except tomllib.TOMLDecodeError as err:
        # tomllib's messages quote keys and characters of the file: keep only its position.
        at = re.search(r"\((at line \d+, column \d+|at end of document)\)$", str(err))
        raise Refused(f"does not parse as TOML ({at.group(1) if at else 'position unknown'})") from None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"at line {mark.line + 1}, column {mark.column + 1}" if mark else "position unknown"
        raise Refused(f"does not parse as YAML ({type(err).__name__} {where})") from None
    except yaml.YAMLError as err:
        raise Refused(f"does not parse as YAML ({type(err).__name__})") from None
    except RecursionError:
        raise Refused(f"nested deeper than {MAX_DEPTH} levels") from None
    except ValueError:  # an integer of more digits than Python converts, and the like
        raise Refused("a value cannot be converted (an integer too long?)") from None
    _check_plain(data)
    return data


def parse_data_bounded(raw: bytes, suffix: str, seconds: float = PARSE_SECONDS) -> Any:
    """Parse in a child process that is killed after `seconds` of parsing: for files the box may
    have written. The clock starts when the child says it is ready, after its interpreter and
    imports: on a loaded machine those alone took over 2 s, and a legitimate policy was refused."""
    from ..ground.deadline import ChildStopped, Stopped, run_with_deadline

    try:
        code, out = run_with_deadline(
            os.path.abspath(__file__), [suffix, str(max(1, int(seconds) + 1))], raw, seconds, START_SECONDS
        )
    except ChildStopped as stop:
        raise Refused(
            {
                Stopped.NOT_STARTED: f"the parser did not start within {START_SECONDS:g} s",
                Stopped.TIMED_OUT: f"took longer than {seconds:g} s to parse",
            }.get(stop.how, f"the parser failed ({stop.detail})")
        ) from None
    if code != 0:
        raise Refused(f"the parser failed (exit {code}: over its CPU or memory limit?)")
    try:
        reply = json.loads(out)
    except ValueError:
        raise Refused("the parser gave no answer") from None
    if "refused" in reply:
        raise Refused(str(reply["refused"]))
    return reply["data"]


def _child(suffix: str, cpu_seconds: int) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds))
    resource.setrlimit(resource.RLIMIT_AS, (_CHILD_MEMORY, _CHILD_MEMORY))
    sys.stdout.buffer.write(b"R")  # started and imported: the parent's clock starts now
    sys.stdout.buffer.flush()
    raw = sys.stdin.buffer.read()
    try:
        reply: dict[str, Any] = {"data": parse_data(raw, suffix)}
    except Refused as err:
        reply = {"refused": str(err)}
    except MemoryError:  # which bound a slow, greedy input hits first depends on the machine's speed
        reply = {"refused": f"needs more than {_CHILD_MEMORY >> 20} MiB to parse"}
    sys.stdout.write(json.dumps(reply))


if __name__ == "__main__":
    _child(sys.argv[1], int(sys.argv[2]))
