"""How one of the user's MCP servers is started on the host (issue 49: every host program the product
starts is found once, at the start, outside every place the box can write).

A server is named as its docs write it: `npx -y pkg`, `uvx pkg`, `python3 server.py`, `node
server.js`, a script with a `#!/usr/bin/env python3` line. The user's PATH often has the workspace
first (an active project venv, direnv's `PATH_add`, node_modules/.bin), and the user often starts
oa-sandbox in the workspace; the box writes there. So, at the session's start (`plan`):

- its program and every `#!` interpreter are found as a hook's are (programs/resolve.py): on the
  user's PATH (or the server's own `env.PATH`) without any entry the box could change, and run by
  those absolute paths; one that lies where the box writes is refused, named;
- an argument naming a file where the box writes (a script the interpreter would run, a module, a
  config) is refused; a directory is passed, as data the server serves;
- its working directory is its own empty directory (`python -m` and `-c` put the working directory
  first on sys.path; npx runs node_modules/.bin from it; pyenv, asdf and mise read their version
  files from it), or the `cwd` the user gave, which must lie outside too;
- its environment is the SDK's default (HOME, LOGNAME, PATH, SHELL, TERM, USER: no PYTHON*,
  NODE_*, LD_* variable of the user's) with that PATH, and the server's own `env`; a loader variable
  there (PYTHONPATH, NODE_OPTIONS, LD_PRELOAD, ...) naming a place the box writes is refused; a
  SHELL there is left out; a HOME there (git, npm, pip and Python's user site read their dotfiles
  from it) becomes the server's own empty directory, unless the server's `env` names HOME itself.

A refused server is left out, named in the host's `problems`, and the session goes on, as with one
that fails to start. `oa-sandbox doctor` shows what each server runs (cli/admin.py).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from ...errors import ErrorType, OpenAgentsError
from ...programs.reach import reaches
from ...programs.resolve import WHERE, Resolved, SearchPath, resolve, search_path
from .spec import McpServerSpec

# Variables that make a program load code from where they point (the hooks' list, hooks/run.py, inherits none of them).
LOADERS = (
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONSTARTUP",
    "PYTHONUSERBASE",
    "NODE_PATH",
    "NODE_OPTIONS",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "LD_AUDIT",
    "PERL5LIB",
    "PERLLIB",
    "PERL5OPT",
    "RUBYLIB",
    "RUBYOPT",
    "GEM_HOME",
    "GEM_PATH",
    "BASH_ENV",
    "ENV",
    "LUA_PATH",
    "LUA_INIT",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "DYLD_INSERT_LIBRARIES",
    "GIT_CONFIG_GLOBAL",
    "NPM_CONFIG_USERCONFIG",
)
_PATHS_IN = re.compile(r"/[^\s:;,=]*")


@dataclass(frozen=True)
class Launch:
    """What a server runs: `resolved.argv` (every program by an absolute path), `env`, `cwd` (None:
    its own empty directory), `own_home` (HOME is that directory), and the PATH entries left out."""

    resolved: Resolved
    env: dict[str, str]
    cwd: str | None
    own_home: bool
    search: SearchPath

    @property
    def argv(self) -> tuple[str, ...]:
        return self.resolved.argv

    def notes(self) -> list[str]:
        """What the user's PATH or environment would have given the server from where the box writes."""
        out = list(self.resolved.notes)
        if self.own_home:
            out.append(
                f"HOME {os.environ.get('HOME', '')} lies {WHERE}: the server gets an empty directory of its own as HOME"
            )
        return out


def _refuse(name: str, why: str) -> OpenAgentsError:
    return OpenAgentsError(ErrorType.CONFIG_INVALID, f"MCP server {name!r} not started: {why}")


def plan(spec: McpServerSpec, roots: Sequence[Path], defaults: Mapping[str, str]) -> Launch:
    """The server's start, decided now (see the module's doc). `defaults`: the SDK's default
    environment. Raises OpenAgentsError (config_invalid) when it would run or load what the box
    can change; a program that cannot be found or run comes back with `resolved.problem` set."""
    env = {**defaults, **spec.env}
    search = search_path(roots, env.get("PATH", os.defpath))
    env["PATH"] = search.value
    cwd = os.path.abspath(spec.cwd) if spec.cwd else None
    if cwd is not None and reaches(cwd, roots):
        raise _refuse(
            spec.name,
            f"its working directory {cwd} lies {WHERE} (python -m, npx and version managers load code from it): "
            "give it a directory outside, or none (it then gets an empty one of its own)",
        )
    for name in LOADERS:
        for path in _PATHS_IN.findall(spec.env.get(name, "")):
            if reaches(path, roots):
                raise _refuse(
                    spec.name, f"its env {name} names {path}, {WHERE}: the server would load what the sandbox wrote"
                )
    command = spec.command
    if "/" in command and not os.path.isabs(command) and cwd is not None:
        command = os.path.join(cwd, command)
    try:
        resolved = resolve([command, *spec.args], roots, search)
    except OpenAgentsError as err:
        raise _refuse(spec.name, err.message) from None
    for word in spec.args:
        value = word.split("=", 1)[-1] if word.startswith("-") else word
        if not os.path.isabs(value) and cwd is not None:
            value = os.path.join(cwd, value)
        if os.path.isabs(value) and reaches(value, roots) and not os.path.isdir(value):
            raise _refuse(
                spec.name,
                f"its argument {word} names a file {WHERE} (its interpreter would run, or it would load, what the "
                "sandbox wrote): keep the server's files outside the workspace",
            )
    if "SHELL" in env and "SHELL" not in spec.env and reaches(env["SHELL"], roots):
        del env["SHELL"]
    own_home = "HOME" not in spec.env and "HOME" in env and reaches(env["HOME"], roots)
    return Launch(resolved, env, cwd, own_home, search)
