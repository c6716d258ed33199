"""SWE-ReX's persistent bash session, emulated on a shell tool that starts a fresh process per call.

SWE-agent-style code keeps state in one long-lived bash: `cd`, `export`, variables, functions,
`shopt`. Our box gives each `shell` call its own process with a hard deadline, and nothing may
outlive a call. So each call of a session is one `shell` call whose bash first sources the state
the previous call left, runs the command with `eval`, and on its way out (an EXIT trap, so `exit`
in the command is covered too) writes the state again for the next call: the working directory,
the shell's variables (exported or not, `declare -p`), functions (`declare -f`) and `shopt`s.

The state file is the box's: it lives in the box's /tmp, is written and sourced by the box's own
bash, and the host never reads, parses or executes it. The command itself travels verbatim in a
quoted here-document, so the transcript and a policy see exactly what SWE-ReX asked for, with a
fixed prologue and epilogue that hold no caller data but the state file's random name.
"""

from __future__ import annotations

import shlex
import uuid

STATE_DIR = "/tmp/.oa-swerex"  # the box's tmpfs: never in the workspace, never in a diff
SYNTAX_MARK = "OA-SWEREX-SYNTAX-ERROR"

# Shell variables bash owns or computes: restoring them would fail or lie.
_SKIP = (
    "__oa_*|BASH*|SHELLOPTS|EUID|UID|PPID|SHLVL|RANDOM|SRANDOM|SECONDS|LINENO|HISTCMD|FUNCNAME|GROUPS|DIRSTACK|"
    "PIPESTATUS|EPOCHREALTIME|EPOCHSECONDS|_|PWD|OPTIND|OPTARG|COLUMNS|LINES|COMP_*"
)

# $1: the state file, $2: the command. `bash -n` first, as SWE-ReX's BashSession checks syntax
# before it runs anything (BashIncorrectSyntaxError), then the command at the top level of the
# script, so `cd`, `export` and assignments stay in this shell for the dump.
RUNNER = (
    r"""__oa_state=$1 __oa_cmd=$2; set --
if [ -f "$__oa_state" ]; then . "$__oa_state" >/dev/null 2>&1; fi
if ! __oa_syntax=$(bash -n -c "$__oa_cmd" 2>&1); then printf '%s\n%s\n' "$__oa_syntax" '"""
    + SYNTAX_MARK
    + r"""'; exit 2; fi
__oa_dump() {
  __oa_rc=$?
  trap - EXIT
  mkdir -p -- "${__oa_state%/*}" 2>/dev/null
  {
    printf 'cd -- %q\n' "$PWD"
    for __oa_n in $(compgen -v); do
      case $__oa_n in """
    + _SKIP
    + r""") ;; *) declare -p "$__oa_n" 2>/dev/null ;; esac
    done
    for __oa_n in $(compgen -A function); do
      case $__oa_n in __oa_*) ;; *) declare -f "$__oa_n" ;; esac
    done
    shopt -p
  } >"$__oa_state.new" 2>/dev/null && mv -f -- "$__oa_state.new" "$__oa_state"
  exit "$__oa_rc"
}
trap __oa_dump EXIT
eval "$__oa_cmd"
"""
)


def new_state_path() -> str:
    """A fresh state file per session: its name is ours (random), never the caller's session name."""
    return f"{STATE_DIR}/{uuid.uuid4().hex}.sh"


def session_command(command: str, state: str) -> str:
    """The `shell` tool's command for one call of a session: the caller's command verbatim in a
    quoted here-document (its delimiter random and absent from the command), handed to bash."""
    delimiter = f"OA_SWEREX_{uuid.uuid4().hex}"
    while delimiter in command:  # pragma: no cover - a 128-bit collision
        delimiter = f"OA_SWEREX_{uuid.uuid4().hex}"
    return (
        f"OA_SWEREX_CMD=$(cat <<'{delimiter}'\n{command}\n{delimiter}\n)\n"
        f'exec bash --noprofile --norc -c {shlex.quote(RUNNER)} bash {shlex.quote(state)} "$OA_SWEREX_CMD"'
    )
