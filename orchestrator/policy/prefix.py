"""The shell command prefix that `A` at the terminal approves for the rest of a session.

Approving `pytest -q` with `A` means "stop asking about pytest", not "stop asking about whatever
starts with these bytes": the prefix is the command's first word (two for a tool whose first word
only picks a subcommand, three for `python -m MODULE`), and a later command is allowed only when
the same definition gives the same prefix. So the set of commands a prefix allows is exactly what
the prompt named, and no command can smuggle a second one past it:

- nothing is offered, and nothing matches, for a command holding any shell metacharacter that
  chains, substitutes or redirects (`;`, `&`, `|`, `$`, a backtick, `<`, `>`, parentheses, a
  newline or any other control character);
- nor when a prefix word is anything but a plain word (quotes, backslashes, globs, `~`, an
  assignment such as `LD_PRELOAD=x`), or the command is named by a path (`./run.sh`, `/bin/x`:
  perhaps a file the box wrote);
- nor when the first word runs whatever it is given: a shell, an interpreter (but `python -m
  MODULE`), a wrapper that runs another command (`env`, `sudo`, `xargs`, `timeout`, ...).

The approval is the terminal client's own (approvals.py): never sent on any wire, never a flag.
"""

from __future__ import annotations

import re

MAX_COMMAND_CHARS = 4096  # a longer command is not offered a prefix: a person cannot have read it
_UNSAFE = re.compile(r"[;&|`$<>()\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
_PLAIN_WORD = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+:@%/-]*")
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")

# Each of these runs any code or command its arguments name: a prefix of it would allow everything.
_RUNS_ANYTHING = frozenset(
    {
        "sh",
        "bash",
        "dash",
        "zsh",
        "ksh",
        "mksh",
        "fish",
        "csh",
        "tcsh",
        "ash",
        "busybox",
        "rbash",
        "env",
        "sudo",
        "su",
        "doas",
        "exec",
        "eval",
        "command",
        "builtin",
        "source",
        ".",
        "xargs",
        "nohup",
        "timeout",
        "nice",
        "ionice",
        "stdbuf",
        "time",
        "setsid",
        "chroot",
        "unshare",
        "nsenter",
        "watch",
        "script",
        "flock",
        "parallel",
        "strace",
        "ltrace",
        "gdb",
        "perl",
        "ruby",
        "node",
        "nodejs",
        "deno",
        "bun",
        "php",
        "lua",
        "luajit",
        "tclsh",
        "wish",
        "Rscript",
        "R",
        "julia",
        "awk",
        "gawk",
        "mawk",
        "nawk",
        "sed",
        "find",
        "expect",
        "osascript",
        "pwsh",
        "powershell",
        "npx",
        "pipx",
        "uvx",
    }
)
_PYTHON = re.compile(r"python(\d+(\.\d+)?)?|pypy\d*")
# Their first word only picks a subcommand: the prefix is the two words (`git status`, `npm test`).
_SUBCOMMAND_TOOLS = frozenset(
    {
        "git",
        "npm",
        "pnpm",
        "yarn",
        "cargo",
        "go",
        "pip",
        "pip3",
        "uv",
        "poetry",
        "pdm",
        "hatch",
        "rustup",
        "dotnet",
        "mvn",
        "gradle",
        "bundle",
        "gem",
        "composer",
        "mix",
        "stack",
        "cabal",
        "docker",
        "kubectl",
        "helm",
        "terraform",
    }
)


def shell_prefix(command: str) -> str | None:
    """The prefix `A` would approve for `command`, or None when none may be offered (see above)."""
    if len(command) > MAX_COMMAND_CHARS or _UNSAFE.search(command):
        return None
    words = [
        word for word in re.split(r"[ \t]+", command) if word
    ]  # what /bin/sh splits on; any other space is part of a word
    if not words:
        return None
    name = words[0]
    if not _PLAIN_WORD.fullmatch(name) or "/" in name or name in _RUNS_ANYTHING:
        return None  # a path may name a file the box wrote: only commands found on PATH are offered
    if _PYTHON.fullmatch(name):
        if len(words) >= 3 and words[1] == "-m" and _MODULE.fullmatch(words[2]):
            return " ".join(words[:3])
        return None  # `python -c ...`, `python script.py`: any code at all
    if name in _SUBCOMMAND_TOOLS:
        if len(words) >= 2 and _PLAIN_WORD.fullmatch(words[1]) and not words[1].startswith("-"):
            return " ".join(words[:2])
        return None  # `git -c core.pager=... status`: options before the subcommand change what it runs
    return name


def allowed_by(prefixes: set[str], command: str | None) -> str | None:
    """The approved prefix that covers `command`, if any: the same definition, the same answer."""
    if command is None or not prefixes:
        return None
    prefix = shell_prefix(command)
    return prefix if prefix in prefixes else None
