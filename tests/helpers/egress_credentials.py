"""What tests/egress/test_egress_credentials.py shares with other tests, kept here
(issue 48: helpers in one place, none imported from a test module)."""

from __future__ import annotations

import os
import secrets
import time

import pytest
from docker.types import Mount

from orchestrator.sandbox.egress_tls import SessionCA

TOKEN = "ghp_" + secrets.token_hex(20)


TOKEN_VAR = "OA_TEST_GITHUB_TOKEN"


API = "https://api.test:8443"


@pytest.fixture(scope="module")
def tls_api(egress_project, docker_client, tmp_path_factory):
    """api.test:8443 on the outer network: the testserver image in TLS mode, its certificate from a CA of its own."""
    world = SessionCA(["api.test"])
    certs = tmp_path_factory.mktemp("api-certs")
    (certs / "server.pem").write_text(world.leaves["api.test"]["cert"])
    (certs / "server.key").write_text(world.leaves["api.test"]["key"])
    (certs / "ca.pem").write_text(world.ca_pem)
    for path in (certs, *certs.iterdir()):
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    api = docker_client.api
    image = f"openagents-egress-testserver:{os.environ.get('OA_EGRESS_COMPOSE_TAG', 'compose')}"
    host_config = api.create_host_config(
        network_mode=egress_project["outer"],
        read_only=True,
        cap_drop=["ALL"],
        mounts=[Mount(target="/certs", source=str(certs), type="bind", read_only=True)],
    )
    networking = api.create_networking_config(
        {egress_project["outer"]: api.create_endpoint_config(aliases=["api.test"])}
    )
    cid = api.create_container(
        image,
        command=["tls", "api"],
        environment={"EXPECT_TOKEN": TOKEN},
        host_config=host_config,
        networking_config=networking,
        labels={"com.docker.compose.project": egress_project["project"]},
    )["Id"]
    api.start(cid)
    container = docker_client.containers.get(cid)
    for _ in range(100):
        if (
            container.exec_run(
                ["python3", "-c", "import socket; socket.create_connection(('127.0.0.1', 8443), 1)"]
            ).exit_code
            == 0
        ):
            break
        time.sleep(0.2)
    yield {"container": container, "ca_file": str(certs / "ca.pem")}
    container.remove(force=True)
    world.close()
