"""One path check for every tool, host or box: the host git tool names a bad path exactly as the
file tools do, and a missing path is a typed file_not_found, never a raw Python exception."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import ErrorType, OpenAgentsError
from orchestrator.tools.host_git import HostRepo, parse_args, run_git
from sandbox_agent.paths import PathRefused, check_lexical
from tests.helpers.host_git import init_repo


def git(repo: HostRepo, **raw):
    try:
        args = parse_args(raw)
    except OpenAgentsError as err:
        return err.type
    result = run_git(repo, args)
    return result.error.type if result.error else None


@pytest.fixture
def repo(tmp_path: Path) -> HostRepo:
    ws = tmp_path / "ws"
    init_repo(ws, {"a.txt": "a\n", "src/b.py": "b\n"})
    opened = HostRepo.open_at_start(ws)
    assert opened is not None
    return opened


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "src/../../x", "~/x", "a\x00b"])
@pytest.mark.parametrize("subcommand", ["status", "diff", "log", "commit"])
def test_bad_paths_get_the_file_tools_error_type(repo, subcommand, path):
    try:
        check_lexical(path)
        expected = None
    except PathRefused as err:
        expected = ErrorType(err.kind)
    extra = {"message": "m"} if subcommand == "commit" else {}
    assert git(repo, subcommand=subcommand, paths=[path], **extra) == expected


@pytest.mark.parametrize("subcommand", ["status", "diff", "log", "commit"])
def test_a_missing_path_is_file_not_found(repo, subcommand):
    extra = {"message": "m"} if subcommand == "commit" else {}
    assert git(repo, subcommand=subcommand, paths=["no/such/file.txt"], **extra) in (ErrorType.FILE_NOT_FOUND, None)
    if subcommand == "commit":
        assert git(repo, subcommand="commit", paths=["no/such/file.txt"], message="m") == ErrorType.FILE_NOT_FOUND


def test_a_deleted_tracked_file_can_still_be_committed(repo):
    (Path(repo.workspace) / "a.txt").unlink()
    assert git(repo, subcommand="commit", paths=["a.txt"], message="remove a") is None
