"""Shared fixtures: a real Docker daemon, the real sandbox image, real workspaces on disk.

No test here mocks Docker or the agent. A missing daemon is an error, never a skip.
"""

from __future__ import annotations

import os
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import BOTH_RUNTIMES, make_workspace, require_runtime, sandbox_config

_UNDER_BOTH_RUNTIMES = ("test_tools_in_sandbox.py", "attacks")


def pytest_generate_tests(metafunc):
    """Every test of the tool suite and the attack battery that opens a box (through `runtime`) runs
    under runc and under runsc; elsewhere `runtime` is None, the project's default choice."""
    parts = metafunc.definition.path.parts
    if "runtime" in metafunc.fixturenames and any(p in parts for p in _UNDER_BOTH_RUNTIMES):
        metafunc.parametrize("runtime", BOTH_RUNTIMES, indirect=True)


@pytest.fixture
def runtime(request, docker_client) -> str | None:
    """The runtime a test's boxes run under. runsc is skipped, with the reason, when the daemon lacks a
    usable registration (`scripts/setup` makes one); OA_REQUIRE_RUNSC=1 (CI) makes that a failure."""
    name = getattr(request, "param", None)
    if name is None or name == "runc":
        return name
    return require_runtime(name, docker_client)


@pytest.fixture(scope="session")
def docker_client():
    from orchestrator.sandbox.docker import docker_client as connect

    return connect()


@pytest.fixture(scope="session")
def sandbox_image(docker_client):
    from orchestrator.sandbox.image import ensure_image

    return ensure_image(docker_client)


@pytest.fixture
def workspace(tmp_path: Path) -> Iterator[Path]:
    ws = make_workspace(tmp_path / "ws")
    yield ws
    shutil.rmtree(ws, ignore_errors=True)


@pytest.fixture
def sandbox(sandbox_image, docker_client, workspace, runtime):
    from orchestrator.sandbox.docker import DockerSandbox

    with DockerSandbox(workspace, sandbox_config(runtime, docker_client), client=docker_client) as box:
        yield box


@pytest.fixture
def open_sandbox(sandbox_image, docker_client, runtime):
    """A factory for sandboxes on workspaces the test builds itself; all are removed afterwards."""
    from orchestrator.sandbox.docker import DockerSandbox

    boxes = []

    def _open(ws: Path, **config) -> DockerSandbox:
        box = DockerSandbox(ws, sandbox_config(runtime, docker_client, **config), client=docker_client)
        box.start()
        boxes.append(box)
        return box

    yield _open
    for box in boxes:
        box.close()


_DOCKER_FIXTURES = frozenset(
    {"docker_client", "sandbox_image", "sandbox", "open_sandbox", "box", "box_on", "victim", "victim_factory"}
)
# The tiers (issue 48), one folder each: unit and architecture run without Docker; box, attacks and
# egress run against the real daemon (attacks and egress wholly, box where a test takes a box fixture).
_NO_DOCKER_TIERS = ("unit", "architecture")
_DOCKER_TIERS = ("attacks", "egress")


def _tier(item) -> str | None:
    parts = item.path.parts
    for name in (*_NO_DOCKER_TIERS, "box", *_DOCKER_TIERS):
        if len(parts) >= 2 and parts[-2] == name and parts[-3:-2] == ("tests",):
            return name
    return None


# The box tier's core, run a second time under Podman (issue 47) by scripts/test (`-m podman`, OA_ENGINE=podman):
# the tool contract, the attack battery's kernel-facing part (environment and network, the seccomp profile,
# privilege, resources), copy mode's review and its attacks, and the API (an egress gate made and removed with
# its box). Sized to a few minutes on a quiet machine; docs/podman.md says what differs and how to run more.
_UNDER_PODMAN = frozenset(
    {
        "tests/box/test_tool_contract.py",
        "tests/box/test_api.py",
        "tests/box/test_workspace_modes.py",
        "tests/attacks/test_environment_and_network.py",
        "tests/attacks/test_setuid_and_syscalls.py",
        "tests/attacks/test_privilege.py",
        "tests/attacks/test_copy_review_attacks.py",
    }
)


def pytest_collection_modifyitems(config, items):
    """Tests that need Docker carry the `docker` marker, so `pytest -m "not docker"` runs the fast
    ones in seconds; a test of tests/unit or tests/architecture that needs Docker is a misfiled test,
    and the run stops saying so. Slow tests run last."""
    misfiled, off_the_compose_worker = [], []
    for item in items:
        tier = _tier(item)
        if "docker_services" in getattr(item, "fixturenames", ()) and _scope_of(item.nodeid, "") != _COMPOSE_SCOPE:
            off_the_compose_worker.append(item.nodeid)
        if _DOCKER_FIXTURES & set(getattr(item, "fixturenames", ())) or tier in _DOCKER_TIERS:
            item.add_marker(pytest.mark.docker)
        if item.nodeid.split("::", 1)[0] in _UNDER_PODMAN:
            item.add_marker(pytest.mark.podman)
        if tier in _NO_DOCKER_TIERS and item.get_closest_marker("docker") is not None:
            misfiled.append(item.nodeid)
    if misfiled:
        raise pytest.UsageError(
            "tests of a tier without Docker (tests/unit, tests/architecture) need Docker (a fixture, a marker): "
            "move them "
            "to tests/box or give them the local backend, no daemon (orchestrator/sandbox/local.py):\n  "
            + "\n  ".join(misfiled)
        )
    if off_the_compose_worker:
        raise pytest.UsageError(
            "tests outside tests/egress/ use the egress compose project: name their file in conftest.py's "
            "_ON_THE_COMPOSE_WORKER, so that a parallel run keeps them on the worker that brings it up:\n  "
            + "\n  ".join(off_the_compose_worker)
        )
    # One process: slow tests last (a stable sort: the rest keep their order), so a failure shows up
    # early. A worker of a parallel run (every worker collects, in the same order, and the scheduler
    # hands out files in that order): the costliest files first, so they start at once instead of
    # forming the run's tail (seen in a -n 3 run: its last stretch was the load tests, slow, one worker each).
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=_costliest_file_first(items))
    else:
        items.sort(key=lambda item: item.get_closest_marker("slow") is not None)


def _costliest_file_first(items):
    """A parallel run's order of files, costliest first (longest processing time first: the last file
    handed out is then a short one): a file with a slow test, then by its tests that open boxes (a
    Docker test costs seconds, a unit test milliseconds), then by its number of tests. Within a file the
    collected order stays (a stable sort)."""
    slow, boxes, tests = set(), Counter(), Counter()
    for item in items:
        scope = _scope_of(item.nodeid, item.nodeid.split("::", 1)[0])
        tests[scope] += 1
        if item.get_closest_marker("slow") is not None:
            slow.add(scope)
        if item.get_closest_marker("docker") is not None:
            boxes[scope] += 1

    def key(item):
        scope = _scope_of(item.nodeid, item.nodeid.split("::", 1)[0])
        return (scope not in slow, -boxes[scope], -tests[scope])

    return key


# The compose project of compose/ (tests/egress/conftest.py) is one per machine: pytest-docker brings
# it up in the first test that asks and down at the end of that process's run. Its tests, those of
# tests/egress/ and of the files named here, are one unit of work in a parallel run.
_COMPOSE_SCOPE = "tests/egress/"
_ON_THE_COMPOSE_WORKER = frozenset({"tests/box/test_report_egress.py"})


def _scope_of(nodeid: str, default: str) -> str:
    """The unit of work a parallel run hands one worker: a file (its module-scoped boxes made once), but
    every test of the compose project together, on one worker that brings it up and down once."""
    path = nodeid.split("::", 1)[0]
    if path.startswith(_COMPOSE_SCOPE) or path in _ON_THE_COMPOSE_WORKER:
        return _COMPOSE_SCOPE
    return default


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under `-n N --dist loadfile` (scripts/test): files as units of work, the compose project's tests
    as one (_scope_of), handed out in the order collected."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    # pytest-xdist 3 sorts the files by their number of tests unless told not to (--loadscope-reorder, on by
    # default): that put the load tests' file (4 tests, minutes each) among the last and made the run's tail.
    # The workers' collection is already in the order wanted (_costliest_file_first).
    config.option.loadscopereorder = False

    class _Scheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _scope_of(nodeid, super()._split_scope(nodeid))

    return _Scheduling(config, log)


@pytest.fixture(scope="session", autouse=True)
def deep_trees_removed(tmp_path_factory):
    """Boxes in these tests plant 1,000-deep directory chains on purpose; pytest's own clean-up of its
    temporary directories recurses (shutil.rmtree) and would end the run with a RecursionError. So,
    once every test is done, every tree deeper than 128 levels under pytest's temporary root (this
    run's and earlier runs') is removed first, through boxfs: iteratively, no link followed."""
    yield
    from orchestrator.boxfs import HostBudget, Walk, open_dir, remove_tree

    # A worker of a parallel run (pytest-xdist) cleans its own directory only: its siblings' trees
    # may still be in use. The serial run after it (scripts/test) cleans the rest.
    base = tmp_path_factory.getbasetemp()
    root = base if os.environ.get("PYTEST_XDIST_WORKER") else base.parent
    walk = Walk(root, HostBudget(max_depth=128, max_entries=None, max_bytes=None))
    for _ in walk.entries():
        pass
    for rel in walk.too_deep:
        parent_rel, _, name = rel.rpartition(b"/")
        try:
            fd = open_dir(root / os.fsdecode(parent_rel))
        except Exception:  # noqa: BLE001 - already gone with a shallower one
            continue
        try:
            remove_tree(fd, name, HostBudget(max_entries=None, max_bytes=None))
        except OSError:
            pass
        finally:
            os.close(fd)


@pytest.fixture(autouse=True)
def fork_overlays_unmounted(tmp_path_factory):
    """Forks made as root are overlay mounts (workspace/cow.py), which outlive the process by design:
    after each test those under pytest's temporary root are unmounted, so its clean-up removes plain
    directories (and the host keeps no stale mounts). This run's root only: pytest-of-USER is shared by
    every pytest run on the machine, and a run unmounting there pulled the copies from under another's forks."""
    yield
    from orchestrator.workspace.overlay import mounts_under, unmount

    for point in mounts_under(tmp_path_factory.getbasetemp()) + _mounts_under(tmp_path_factory.getbasetemp()):
        try:
            unmount(point)
        except Exception:  # noqa: BLE001 - a clean-up: the next test's run tries again
            pass


def _mounts_under(root: Path) -> list[Path]:
    """Every other mount under `root` (a copy's size-limited file system and its bind: workspace/quota_fs.py,
    which outlive the process as overlays do), binds and overlays before the file systems under them."""
    prefix = os.path.realpath(root) + "/"
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as fh:
        points = [line.split()[4] for line in fh]
    found = [Path(p) for p in points if p.startswith(prefix)]
    return sorted(found, key=lambda p: (p.name in ("quota", "cow"), -len(p.parts)))
