"""What tests/attacks/test_host_git.py shares with other tests, kept here
(issue 48: helpers in one place, none imported from a test module)."""

from __future__ import annotations

from pathlib import Path

import pygit2

from orchestrator.tools.host_git import HostRepo, parse_args

SIG = pygit2.Signature("Test", "test@example.invalid")


def init_repo(ws: Path, files: dict[str, str | bytes]) -> pygit2.Repository:
    """A trusted starting repository, built with libgit2 (no git program runs, ever, in this file)."""
    ws.mkdir(parents=True, exist_ok=True)
    repo = pygit2.init_repository(str(ws), initial_head="main")
    for rel, content in files.items():
        path = ws / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    index = repo.index
    for rel in files:
        index.add(rel)
    index.write()
    repo.create_commit("HEAD", SIG, SIG, "init", index.write_tree(), [])
    return repo


def run(repo: HostRepo, **args):
    return repo.run(parse_args(args))
