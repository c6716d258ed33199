"""The egress tier's fixtures: the compose project of compose/ (tests/helpers/egress.py) and the TLS API
server of the credential tests (tests/helpers/egress_credentials.py)."""

from tests.helpers.egress import (  # noqa: F401 - fixtures, found by name
    docker_compose_command,
    docker_compose_file,
    docker_compose_project_name,
    docker_setup,
    egress_project,
)
from tests.helpers.egress_credentials import tls_api  # noqa: F401 - a fixture, found by name
