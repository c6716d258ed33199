"""The compose project of compose/, brought up by pytest-docker for the egress tests (tests/egress/,
whose conftest.py offers these fixtures; tests/box/test_report_egress.py imports them).

Every address these tests touch belongs to containers of this project, on networks it creates;
both of its networks are internal, so nothing can leave them.
"""

from __future__ import annotations

import os
import shlex
import time
from pathlib import Path

import pytest

from orchestrator.sandbox.debootstrap import BASE_TAG

ROOT = Path(__file__).resolve().parents[2]
# Another checkout's project may be up at the same time: OA_EGRESS_COMPOSE_PROJECT, OA_EGRESS_COMPOSE_TAG
# and OA_EGRESS_OUTER_CIDR / OA_EGRESS_INTERNAL_CIDR (compose/docker-compose.yml) keep them apart.
OUTER_CIDR = os.environ.get("OA_EGRESS_OUTER_CIDR", "10.231.251.0/24")


@pytest.fixture(scope="session")
def docker_compose_file():
    return str(ROOT / "compose" / "docker-compose.yml")


@pytest.fixture(scope="session")
def docker_compose_command():
    # The project's images build FROM the base the sandbox image is built on (no registry answers
    # here): the debootstrap base's tag carries its package list's hash, so it is named, never left to
    # the compose file's default (an older tag a fresh machine does not have). pytest-docker runs this
    # through a shell, so the variable is set for compose alone, not for the rest of the test run.
    base = os.environ.get("OA_BASE_IMAGE") or BASE_TAG
    return f"env OA_BASE_IMAGE={shlex.quote(base)} docker-compose"


@pytest.fixture(scope="session")
def docker_setup():
    # Debian's docker-compose (v1) has no --wait; readiness is checked in egress_project.
    return ["up --build -d"]


@pytest.fixture(scope="session")
def docker_compose_project_name():
    return os.environ.get("OA_EGRESS_COMPOSE_PROJECT", "oaegress")


@pytest.fixture(scope="session")
def egress_project(sandbox_image, docker_client, docker_services, docker_compose_project_name):
    """The project up and answering: the proxy has logged its start and both servers listen."""
    project = docker_compose_project_name

    def ready() -> bool:
        containers = {
            c.labels.get("com.docker.compose.service"): c
            for c in docker_client.containers.list(filters={"label": f"com.docker.compose.project={project}"})
        }
        if set(containers) != {"egress-proxy", "allowed-server", "denied-server"}:
            return False
        return b'"decision": "start"' in containers["egress-proxy"].logs()

    # `up --build` in a fresh clone builds the project's images first: at CI's load (10-16 on 2 cores) that
    # took over 120 s once, and the worker's egress tests then met a project not yet up
    docker_services.wait_until_responsive(check=ready, timeout=360.0, pause=0.5)
    time.sleep(0.5)
    servers = {}
    for c in docker_client.containers.list(filters={"label": f"com.docker.compose.project={project}"}):
        c.reload()
        servers[c.labels["com.docker.compose.service"]] = c
    return {
        "project": project,
        "internal": f"{project}_internal",
        "outer": f"{project}_outer",
        "allowed_ip": servers["allowed-server"].attrs["NetworkSettings"]["Networks"][f"{project}_outer"]["IPAddress"],
        "proxy": servers["egress-proxy"],
    }


# A program the box runs: fetch a URL, print what came back.
FETCH = (
    "import sys, urllib.request, urllib.error\n"
    "try:\n"
    "    body = urllib.request.urlopen(sys.argv[1], timeout=10).read()\n"
    "    print('OK', len(body), body[:40].decode(errors='replace').strip())\n"
    "except urllib.error.HTTPError as e:\n"
    "    print('HTTP', e.code, e.read().decode(errors='replace')[:200])\n"
    "except Exception as e:\n"
    "    print('FAIL', type(e).__name__, e)\n"
)
