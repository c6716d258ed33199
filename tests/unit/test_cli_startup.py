"""The command line starts at once (issue 50): `oa-sandbox --help` lists every command from
cli/__init__.py's COMMANDS table without importing them, each command's own help still works and
says what the table says, and the help and the light commands import nothing heavy. Also the
set-up's pip stamp: a second scripts/setup with nothing changed runs no pip."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# What a light command must not import: the Docker SDK, the HTTP clients, libgit2, the sandbox and the loop.
HEAVY = (
    "docker",
    "httpx",
    "requests",
    "pygit2",
    "orchestrator.api.sandbox",
    "orchestrator.session",
    "orchestrator.loop",
    "orchestrator.sandbox.docker",
    "orchestrator.models.http",
    "asyncio",
)


def modules_after(args: list[str], tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run `oa-sandbox ARGS` in a fresh interpreter (state and config of its own); its output and the
    modules it had imported at the end."""
    code = (
        "import json, sys\n"
        f"sys.argv = ['oa-sandbox', *{args!r}]\n"
        "from orchestrator.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "sys.stderr.write('\\nMODULES ' + json.dumps(sorted(sys.modules)) + '\\n')\n"
    )
    env = {
        **os.environ,
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "PYTHONPATH": str(ROOT),
    }
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path
    )
    match = re.search(r"^MODULES (.*)$", done.stderr, re.M)
    assert match, done.stderr[-2000:]
    return done, set(json.loads(match.group(1)))


def test_the_help_lists_every_command_without_importing_one(tmp_path):
    from orchestrator.cli import COMMANDS

    done, modules = modules_after(["--help"], tmp_path)
    listed = re.findall(r"^  (\S+)\s", done.stdout.split("Commands:", 1)[1], re.M)
    assert listed == sorted(COMMANDS)
    commands = {name.split(":")[0] for name, _ in COMMANDS.values()}
    assert not {f"orchestrator.cli.{c}" for c in commands} & modules, "a command's module was imported for --help"
    assert not set(HEAVY) & modules and "pydantic" not in modules and "orchestrator.config" not in modules


def test_each_commands_help_works_and_the_table_says_what_the_command_says():
    """Each command loads from its line in COMMANDS, and its short help, as `--help` lists it at any
    width, is the one the table gives (the table cannot drift from the command's docstring)."""
    import click

    from orchestrator.cli import COMMANDS, main

    ctx = click.Context(main)
    for name, (_, short) in COMMANDS.items():
        command = main.get_command(ctx, name)
        assert isinstance(command, click.Command) and command.name == name
        for limit in range(20, 400, 7):
            assert click.Command(name, help=short).get_short_help_str(limit) == command.get_short_help_str(limit), (
                name,
                limit,
            )
        with click.Context(command, info_name=name, parent=ctx) as sub:
            text = command.get_help(sub)
        assert text.startswith(f"Usage: {name} ") and " ".join(short.split()[:3]) in " ".join(text.split()), (
            name,
            text[:300],
        )


@pytest.mark.parametrize(
    "args",
    [
        ["sessions", "--help"],
        ["changes", "--help"],
        ["image", "--help"],
        ["hooks", "--help"],
        ["exec", "--help"],
        ["run", "--help"],
        ["batch", "--help"],
        ["fork", "--help"],
    ],
)
def test_a_commands_help_imports_nothing_heavy(tmp_path, args):
    done, modules = modules_after(args, tmp_path)
    assert done.stdout.startswith("Usage: "), done.stderr[-2000:]
    assert not set(HEAVY) & modules, sorted(set(HEAVY) & modules)


def test_sessions_and_changes_import_only_what_they_use(tmp_path):
    done, modules = modules_after(["sessions"], tmp_path)
    assert done.stdout.startswith("ID "), done.stdout + done.stderr[-2000:]
    assert not set(HEAVY) & modules, sorted(set(HEAVY) & modules)
    done, modules = modules_after(["changes", "20990101-000000-abcdef"], tmp_path)
    assert "20990101-000000-abcdef" in done.stderr, done.stderr[-2000:]
    assert not set(HEAVY) & modules, sorted(set(HEAVY) & modules)


def _pip_functions() -> str:
    """scripts/setup's pip_stamp and pip_install, as the script defines them."""
    text = (ROOT / "scripts" / "setup").read_text()
    start = text.index("pip_stamp() {")
    end = text.index("venv_and_pip() {")
    return text[start:end]


def test_a_second_setup_with_nothing_changed_runs_no_pip(tmp_path):
    """pip_install skips pip while pyproject.toml, the extras and the venv's python are what its last
    install had; any of them changed, or a failed install, and pip runs again. (`.venv/bin/pip` here
    records its calls: the stamp's logic is under test, not pip.)"""
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    calls = tmp_path / "pip-calls"
    (bin_dir / "pip").write_text(f'#!/bin/sh\necho "$*" >> {calls}\n[ ! -e {tmp_path}/pip-fails ]\n')
    (bin_dir / "python").write_text("#!/bin/sh\necho Python 3.11.7\n")
    for program in ("pip", "python"):
        (bin_dir / program).chmod(0o755)
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")

    def install(extras: str) -> subprocess.CompletedProcess[str]:
        script = f"set -euo pipefail\n{_pip_functions()}\npip_install {'extras' if extras else 'core'} '{extras}'\n"
        return subprocess.run(["/bin/bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60)

    def pip_runs() -> int:
        return len(calls.read_text().splitlines()) if calls.exists() else 0

    assert install("").returncode == 0 and pip_runs() == 1
    second = install("")
    assert second.returncode == 0 and pip_runs() == 1 and "skipped" in second.stdout
    assert install("test,ray").returncode == 0 and pip_runs() == 2 and "-e .[test,ray]" in calls.read_text()
    assert install("test,ray").returncode == 0 and pip_runs() == 2
    assert install("test").returncode == 0 and pip_runs() == 3  # other extras: another install
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\nversion = '2'\n")
    (tmp_path / "pip-fails").touch()
    assert install("").returncode != 0 and pip_runs() == 4  # pyproject changed: pip again, and it failed
    (tmp_path / "pip-fails").unlink()
    assert install("").returncode == 0 and pip_runs() == 5  # a failed install left no stamp
    assert install("").returncode == 0 and pip_runs() == 5


def test_a_mistyped_command_is_told_the_closest_names_though_none_is_loaded(tmp_path):
    done, modules = modules_after(["sesions"], tmp_path)
    assert "No such command 'sesions'." in done.stderr and "Did you mean 'sessions'?" in done.stderr, done.stderr[
        -1000:
    ]
    assert "orchestrator.cli.sessions" not in modules


def test_the_collector_paused_for_a_commands_start_is_back_as_it_was(tmp_path):
    """The group pauses the cyclic collector while a command starts (issue 50) and exec resumes it once
    its session is open: an exec that ends before (its arguments refused) leaves an in-process caller's
    collector enabled and nothing frozen, as does any other command."""
    import gc

    from click.testing import CliRunner

    from orchestrator.cli import main

    assert gc.isenabled()
    refused = CliRunner().invoke(main, ["exec", "--workspace", str(tmp_path), "read_file", "{not json"])
    assert refused.exit_code != 0 and '"ok":false' in refused.output, refused.output
    assert gc.isenabled() and gc.get_freeze_count() == 0
    gc.disable()
    try:  # a caller that had it off gets it off
        assert CliRunner().invoke(main, ["exec", "--workspace", str(tmp_path), "read_file", "{}"]).exit_code != 0
        assert not gc.isenabled()
    finally:
        gc.enable()
    assert CliRunner().invoke(main, ["sessions"], env={"XDG_STATE_HOME": str(tmp_path)}).exit_code == 0
    assert gc.isenabled() and gc.get_freeze_count() == 0
