"""Issue 49, items 2 and 3, without a box: a hook's program, the interpreter on its `#!` line and
what that interpreter loads are found once, at the session's start, on a PATH with no entry the box
can write (by spelling or by real path; relative and empty entries dropped); the hook then runs
with that PATH and with those absolute paths, so nothing is looked up again where the box writes.
A secret reaches a hook only by its own name.

The user's hooks are their own (the user tier, outside the workspace), written as docs/hooks.md
shows them, and the user's PATH has the workspace first, as an active project venv, direnv's
`PATH_add` or node_modules/.bin make it. The box's writes are made here, after the start, as one
shell call in a bind-mode box would make them (tests/attacks/test_hook_attacks.py has real boxes
make them, under runc and runsc). Real hook processes, a real venv, the real CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from orchestrator.hooks import wiring
from orchestrator.hooks.engine import Hooks
from orchestrator.policy.hook_spec import Collected
from orchestrator.policy.ladder import Tier, parse_policy
from orchestrator.transcript import Transcript

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_PATH = (
    "/usr/local/bin:/usr/bin:/bin"  # the host's own programs: what the user's PATH has after the workspace's entry
)


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("OA_ADMIN_POLICY", raising=False)


def system(name: str) -> str:
    found = shutil.which(name, path=SYSTEM_PATH)
    if found is None:
        pytest.skip(f"no {name} on this host")
    return found


def start(
    tmp_path: Path,
    ws: Path,
    toml: str,
    trusted: bool = False,
    model_key: str | None = None,
    withheld: list[str] | None = None,
    workspace_toml: str = "",
) -> tuple[Hooks | None, Path]:
    """The session's start as session/assemble.py makes it: the user's file's hooks (and a
    workspace file's), in force, resolved."""
    collected = Collected()
    collected.specs += parse_policy(toml.encode(), str(tmp_path / "user.toml"), ".toml", Tier.USER).hooks
    if workspace_toml:
        collected.specs += parse_policy(
            workspace_toml.encode(), ".openagents/policy.toml", ".toml", Tier.WORKSPACE, untrusted=True
        ).hooks
    collected.trusted = trusted
    path = tmp_path / "t.jsonl"
    return wiring.make(collected, ws, Transcript(path), "s1", model_key, withheld=withheld or []), path


def records(path: Path) -> list[dict]:
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["type"] == "hook"]


def hook_toml(argv: list[str], event: str = "BeforeTool", extra: str = "") -> str:
    return f'[[hooks]]\nevent = "{event}"\ncommand = {json.dumps(argv)}\n{extra}\n'


def script(tmp_path: Path, name: str, text: str) -> Path:
    """One of the user's hook scripts, outside the workspace."""
    path = tmp_path / "hooks" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def plant(path: Path, canary: Path) -> None:
    """What the box writes: a program that, run on the host, says so in `canary`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.exists():
        path.unlink()
    path.write_text(f'#!/bin/sh\necho "$0 $*" >> {canary}\ncat >/dev/null\n')
    path.chmod(0o755)


def fire(hooks: Hooks | None) -> None:
    assert hooks is not None, "the user's own hooks are not in force"
    verdict = hooks.fire(
        "BeforeTool", {"tool_name": "shell", "tool_input": {"command": "ls"}}, tool="shell", call_id="c1"
    )
    assert not verdict.blocked, verdict.reason


def layout(kind: str, tmp_path: Path, ws: Path) -> tuple[str, Callable[[], Path]]:
    """The user's PATH entry that reaches the workspace, and the box's move that gives it a directory of its own."""
    if kind == "link-into-workspace":  # ~/bin/project -> WS/.venv/bin
        (ws / ".venv/bin").mkdir(parents=True)
        link = tmp_path / "links" / "bin"
        link.parent.mkdir()
        link.symlink_to(ws / ".venv/bin")
        return str(link), lambda: ws / ".venv/bin"
    if kind == "workspace-link-out":  # WS/tools -> a directory outside, which the box replaces
        outside = tmp_path / "elsewhere"
        outside.mkdir()
        (ws / "tools").symlink_to(outside)

        def replace() -> Path:
            (ws / "tools").unlink()
            (ws / "tools").mkdir()
            return ws / "tools"

        return str(ws / "tools"), replace
    folder = ws / {"venv": ".venv/bin", "direnv-PATH_add": "bin", "node_modules": "node_modules/.bin"}[kind]
    folder.mkdir(parents=True)
    return str(folder), lambda: folder


LAYOUTS = ["venv", "direnv-PATH_add", "node_modules", "link-into-workspace", "workspace-link-out"]
# route: (the hook's command, or None for a script of the user's; the script's #! line; the program the box plants)
ROUTES = {
    "sh -c": (["sh", "-c", "cat >/dev/null"], "", "sh"),
    "python3 -c": (["python3", "-c", "import sys; sys.stdin.read()"], "", "python3"),
    "env python3": (None, "#!/usr/bin/env python3\n", "python3"),
    "env -S python3 -I": (None, "#!/usr/bin/env -S python3 -I\n", "python3"),
    "env node": (None, "#!/usr/bin/env node\n", "node"),
    "env perl": (None, "#!/usr/bin/env perl\n", "perl"),
    "env bash": (None, "#!/usr/bin/env bash\n", "bash"),
    "sh -c starting python3": (["sh", "-c", "python3 -c pass; cat >/dev/null"], "", "python3"),
}


@pytest.mark.parametrize("where", LAYOUTS)
@pytest.mark.parametrize("route", list(ROUTES))
def test_a_program_the_box_plants_on_the_users_path_never_runs_for_a_hook(tmp_path, monkeypatch, where, route):
    """Attack (issue 49, item 2): the workspace is first on the user's PATH; the user's hook is a
    script outside the workspace starting `#!/usr/bin/env X`, or `["sh", "-c", ...]`. After the
    start the box writes X (or sh) there: the hook's next run ran it on the host, and the hook's
    event said ok. Now the hook runs the host's X, found at the start outside the workspace, and
    its event names what ran."""
    argv, shebang, planted = ROUTES[route]
    system(planted)
    ws = tmp_path / "ws"
    ws.mkdir()
    canary = tmp_path / "canary"
    entry, box_dir = layout(where, tmp_path, ws)
    monkeypatch.setenv("PATH", f"{entry}:{SYSTEM_PATH}")
    command = argv or [str(script(tmp_path, "guard", shebang))]
    hooks, path = start(tmp_path, ws, hook_toml(command))
    plant(box_dir() / planted, canary)  # the box's shell call
    fire(hooks)
    assert not canary.exists(), f"the box's program ran on the host: {canary.read_text()}"
    (record,) = records(path)
    assert record["outcome"] == "ok"
    assert record["argv"] and not any(str(ws) in word or str(tmp_path / "links") in word for word in record["argv"]), (
        record["argv"]
    )
    if argv is None:  # a script: run by its interpreter, both named by absolute paths
        assert record["argv"][-1] == os.path.realpath(command[0]) and os.path.isabs(record["argv"][0])


@pytest.mark.parametrize("entry", [".", "", "bin"], ids=["dot", "empty", "relative"])
@pytest.mark.parametrize("trusted", [False, True], ids=["untrusted", "trust_workspace_hooks"])
def test_relative_path_entries_find_nothing_for_a_hook(tmp_path, monkeypatch, entry, trusted):
    """Attack: the user runs oa-sandbox from the workspace with `.` (or an empty or relative entry)
    on PATH; an earlier session's box left `sh` there. The user's `sh -c` hook was taken for the
    workspace's sh: left out (untrusted), or run from a pinned copy of the box's sh (trusted). A
    relative entry is now no entry: the hook is the user's and runs the host's sh."""
    ws = tmp_path / "ws"
    canary = tmp_path / "canary"
    plant(ws / "sh", canary)
    plant(ws / "bin" / "sh", canary)
    monkeypatch.chdir(ws)
    monkeypatch.setenv("PATH", f"{entry}:{SYSTEM_PATH}")
    hooks, path = start(tmp_path, ws, hook_toml(["sh", "-c", "cat >/dev/null"]), trusted=trusted)
    fire(hooks)
    assert not canary.exists(), canary.read_text()
    (record,) = records(path)
    assert record["outcome"] == "ok" and record["argv"][0] == system("sh")


def make_venv(ws: Path) -> Path:
    """The project's venv, as `python -m venv .venv` makes it (no pip: quicker, the same layout)."""
    subprocess.run(
        [system("python3"), "-m", "venv", "--without-pip", str(ws / ".venv")],
        check=True,
        capture_output=True,
        timeout=120,
    )
    (site,) = (ws / ".venv" / "lib").glob("python3*/site-packages")
    return site


def test_a_pth_file_the_box_drops_into_the_workspace_venv_never_runs_in_a_hook(tmp_path, monkeypatch):
    """Attack: the project venv is active; the box drops a .pth file into its site-packages. Every
    python3 a hook started (the `#!/usr/bin/env python3` script, a bare `python3`, one a `sh -c`
    hook starts) was the venv's and ran the .pth's import line on the host."""
    ws = tmp_path / "ws"
    ws.mkdir()
    site = make_venv(ws)
    canary = tmp_path / "canary"
    monkeypatch.setenv("PATH", f"{ws / '.venv/bin'}:{SYSTEM_PATH}")
    guard = script(tmp_path, "guard.py", "#!/usr/bin/env python3\nimport json, sys\njson.load(sys.stdin)\n")
    toml = (
        hook_toml([str(guard)])
        + hook_toml(["python3", "-c", "import sys; sys.stdin.read()"])
        + hook_toml(["sh", "-c", "python3 -c pass; cat >/dev/null"])
    )
    hooks, path = start(tmp_path, ws, toml)
    (site / "oa_box.pth").write_text(
        f"import os; open({str(canary)!r}, 'a').write('pth ran\\n')\n"
    )  # the box's shell call
    fire(hooks)
    assert not canary.exists(), canary.read_text()
    assert [r["outcome"] for r in records(path)] == ["ok", "ok", "ok"]


def test_a_hook_whose_program_or_interpreter_lies_in_the_workspace_is_refused_at_the_start(
    tmp_path, monkeypatch, capfd
):
    """A script of the user's whose #! line names the workspace venv's python (or `env` of a program
    found only there), or a bare program found only in the workspace's PATH entry: what would run is
    the box's to rewrite. Refused at the start, saying what and where; nothing of it runs."""
    ws = tmp_path / "ws"
    canary = tmp_path / "canary"
    plant(ws / ".venv/bin/python3", canary)
    plant(ws / ".venv/bin/oa-only-in-the-venv", canary)
    monkeypatch.setenv("PATH", f"{ws / '.venv/bin'}:{SYSTEM_PATH}")
    by_path = script(tmp_path, "a.py", f"#!{ws}/.venv/bin/python3\n")
    by_env = script(tmp_path, "b", "#!/usr/bin/env oa-only-in-the-venv\n")
    by_arg = script(tmp_path, "c.js", f"#!/usr/bin/env -S node --require {ws}/setup.js\n")
    bare = ["oa-only-in-the-venv", "--check"]
    hooks, path = start(
        tmp_path, ws, "".join(hook_toml(argv) for argv in ([str(by_path)], [str(by_env)], [str(by_arg)], bare))
    )
    assert hooks is None
    said = capfd.readouterr().err
    assert (
        f"{ws}/.venv/bin/python3" in said and f"{ws}/.venv/bin/oa-only-in-the-venv" in said and f"{ws}/setup.js" in said
    )
    reasons = [r["reason"] for r in records(path)]
    assert [r["outcome"] for r in records(path)] == ["not_in_force"] * 4 and all(
        "where the sandbox can write" in r for r in reasons
    ), reasons
    assert not canary.exists()


LOADERS = {
    "PYTHONPATH": "{ws}",
    "PYTHONSTARTUP": "{ws}/s.py",
    "PYTHONHOME": "{ws}",
    "PYTHONUSERBASE": "{ws}",
    "NODE_OPTIONS": "--require {ws}/x.js",
    "NODE_PATH": "{ws}",
    "LD_PRELOAD": "{ws}/x.so",
    "LD_LIBRARY_PATH": "{ws}",
    "DYLD_INSERT_LIBRARIES": "{ws}/x.dylib",
    "PERL5LIB": "{ws}",
    "PERLLIB": "{ws}",
    "PERL5OPT": "-M{ws}",
    "RUBYLIB": "{ws}",
    "RUBYOPT": "-r{ws}/x",
    "GEM_HOME": "{ws}",
    "BASH_ENV": "{ws}/x.sh",
    "ENV": "{ws}/x.sh",
    "LUA_PATH": "{ws}/?.lua",
    "LUA_INIT": "@{ws}/x.lua",
    "JAVA_TOOL_OPTIONS": "-javaagent:{ws}/x.jar",
    "_JAVA_OPTIONS": "-javaagent:{ws}/x.jar",
    "TMPDIR": "{ws}/tmp",
}


def test_a_hook_runs_with_the_clean_path_and_no_inherited_loader_variables(tmp_path, monkeypatch):
    """The hook's PATH has no entry under a box root (spelt there, or a link into one) and no relative
    or empty one; no PYTHON*/NODE_*/LD_*/PERL*/RUBY*/BASH_ENV/LUA_*/JAVA_* variable reaches it unless
    its table lists it (PERL5LIB here); TMPDIR under the workspace is left out."""
    ws = tmp_path / "ws"
    (ws / ".venv/bin").mkdir(parents=True)
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "bin").symlink_to(ws / ".venv/bin")
    user_bin = tmp_path / "userbin"
    user_bin.mkdir()
    monkeypatch.setenv("PATH", f"{ws}/.venv/bin:.::bin:{tmp_path}/links/bin:{ws}/../ws/bin:{user_bin}:{SYSTEM_PATH}")
    for name, value in LOADERS.items():
        monkeypatch.setenv(name, value.format(ws=ws))
    dump = tmp_path / "env.json"
    guard = script(
        tmp_path,
        "dump.py",
        f"#!{sys.executable}\nimport json, os\nopen({str(dump)!r}, 'w').write(json.dumps(dict(os.environ)))\n",
    )
    hooks, _ = start(tmp_path, ws, hook_toml([str(guard)], extra='env = ["PERL5LIB", "PATH"]'))
    fire(hooks)
    env = json.loads(dump.read_text())
    assert env["PATH"].split(":") == [str(user_bin), *SYSTEM_PATH.split(":")]
    assert env["PERL5LIB"] == str(ws)
    assert sorted(set(LOADERS) & set(env)) == ["PERL5LIB"]


def test_a_secret_reaches_a_hook_only_by_its_own_name(tmp_path, monkeypatch):
    """Attack (issue 49, item 3): the variable an [[egress.credentials]] rule reads reached every hook
    that listed it in `env`. Now the model key and every credential's variable are withheld from
    `env`; a user's or admin's hook table passes one by naming it in `secrets`; a workspace file's
    hook never gets one, trusted or not."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-model-key-for-the-hook-test")
    monkeypatch.setenv("OA_TEST_GH_TOKEN", "ghp_credential_for_the_hook_test")
    monkeypatch.setenv("AUDIT_TOKEN", "audit-token-the-user-listed")
    ws = tmp_path / "ws"
    ws.mkdir()
    dumper = script(
        tmp_path,
        "dump.py",
        f"#!{sys.executable}\nimport json, os, sys\nopen(sys.argv[1], 'w').write(json.dumps(dict(os.environ)))\n",
    )
    listed = 'env = ["OPENAI_API_KEY", "OA_TEST_GH_TOKEN", "AUDIT_TOKEN"]'
    user = (
        hook_toml([str(dumper), str(tmp_path / "env-listed")], extra=listed)
        + hook_toml([str(dumper), str(tmp_path / "env-credential")], extra=listed + '\nsecrets = ["OA_TEST_GH_TOKEN"]')
        + hook_toml([str(dumper), str(tmp_path / "env-key")], extra='secrets = ["OPENAI_API_KEY"]')
    )
    workspace = hook_toml(
        [str(dumper), str(tmp_path / "env-workspace")],
        extra=listed + '\nsecrets = ["OPENAI_API_KEY", "OA_TEST_GH_TOKEN"]',
    )
    hooks, _ = start(
        tmp_path,
        ws,
        user,
        trusted=True,
        model_key="OPENAI_API_KEY",
        withheld=["OA_TEST_GH_TOKEN"],
        workspace_toml=workspace,
    )
    fire(hooks)

    def got(name: str) -> set[str]:
        env = json.loads((tmp_path / name).read_text())
        return {k for k in ("OPENAI_API_KEY", "OA_TEST_GH_TOKEN", "AUDIT_TOKEN") if k in env}

    assert got("env-listed") == {"AUDIT_TOKEN"}
    assert got("env-credential") == {"AUDIT_TOKEN", "OA_TEST_GH_TOKEN"}
    assert got("env-key") == {"OPENAI_API_KEY"}
    assert got("env-workspace") == {"AUDIT_TOKEN"}


def test_the_hooks_command_shows_what_each_hook_runs_and_names_what_lies_in_the_workspace(tmp_path):
    """`oa-sandbox hooks` with the project venv first on PATH: each hook's program and interpreter as
    resolved, what the user's PATH would have found inside the workspace instead, the PATH entries
    left out, the hook refused for an interpreter in the workspace, and the secrets withheld."""
    ws = tmp_path / "ws"
    ws.mkdir()
    make_venv(ws)
    guard = script(tmp_path, "guard.py", "#!/usr/bin/env python3\n")
    inside = script(tmp_path, "inside.py", f"#!{ws}/.venv/bin/python3\n")
    policy = tmp_path / "user.toml"
    policy.write_text(
        '[egress]\nrules = [{action = "allow", host = "api.test"}]\n'
        'credentials = [{host = "api.test", header = "Authorization", value = "Bearer ${OA_TEST_GH_TOKEN}"}]\n\n'
        + hook_toml([str(guard)], extra='id = "guard"\nenv = ["OA_TEST_GH_TOKEN"]')
        + hook_toml(["sh", "-c", "cat >/dev/null"], extra='id = "shell"')
        + hook_toml([str(inside)], extra='id = "inside"')
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "OA_ADMIN_POLICY": str(tmp_path / "none"),
        "PATH": f"{ws}/.venv/bin:{SYSTEM_PATH}",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "hooks", "--workspace", str(ws), "--policy", str(policy)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    python3 = system("python3")
    assert f"runs: {python3} {guard}" in out and f"interpreter {os.path.realpath(python3)}" in out
    assert f"python3 at {ws}/.venv/bin/python3" in out  # what the user's PATH would have run, named
    assert f"runs: {system('sh')} -c" in out
    assert f"PATH entry {ws}/.venv/bin left out" in out
    assert "not in force: inside" in out and f"{ws}/.venv/bin/python3" in out.split("not in force: inside", 1)[1]
    assert "withheld: OA_TEST_GH_TOKEN" in out


def test_a_home_in_the_workspace_gives_each_hook_one_of_its_own(tmp_path, monkeypatch):
    """HOME lies in the workspace (the box writes ~/.gitconfig, ~/.npmrc, Python's user site): a
    `git status` hook on a repository outside never runs the core.fsmonitor program the box's
    ~/.gitconfig names, and its HOME is an empty directory of its own; a hook that lists HOME in
    `env` gets the user's, as asked."""
    git = system("git")
    ws = tmp_path / "ws"
    home = ws / "home"
    home.mkdir(parents=True)
    canary = tmp_path / "canary"
    plant(ws / "tools/fsmonitor", canary)
    (home / ".gitconfig").write_text(f"[core]\n\tfsmonitor = {ws}/tools/fsmonitor\n[safe]\n\tdirectory = *\n")
    repo = tmp_path / "repo"
    subprocess.run([git, "init", "-q", str(repo)], check=True, env={"PATH": SYSTEM_PATH, "HOME": str(tmp_path)})
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("PATH", SYSTEM_PATH)
    dump = script(
        tmp_path,
        "dump.py",
        f"#!{sys.executable}\nimport json, os, sys\nopen(sys.argv[1], 'w').write(json.dumps(dict(os.environ)))\n",
    )
    hooks, path = start(
        tmp_path,
        ws,
        hook_toml(["git", "-C", str(repo), "status", "--short"])
        + hook_toml([str(dump), str(tmp_path / "own.json")])
        + hook_toml([str(dump), str(tmp_path / "listed.json")], extra='env = ["HOME"]'),
    )
    fire(hooks)
    assert not canary.exists(), canary.read_text()
    assert [r["outcome"] for r in records(path)] == ["ok", "ok", "ok"], records(path)
    own = json.loads((tmp_path / "own.json").read_text())["HOME"]
    assert str(ws) not in own and os.path.isabs(own) and not os.path.exists(own)  # its own, gone with its run
    assert json.loads((tmp_path / "listed.json").read_text())["HOME"] == str(home)
