"""The backend's config: one class per backend, told apart by `kind`, made into a backend in one
place (sandbox/backend.py), while the flat spellings users have (--image, --runtime, config.toml's
`image` and `runtime`, `SandboxConfig(runtime=...)`) keep meaning the Docker backend's settings."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from orchestrator.config import DockerBackendConfig, SandboxConfig
from orchestrator.errors import ErrorType, OpenAgentsError
from orchestrator.sandbox.backend import backend_from_config
from orchestrator.sandbox.docker import docker_options
from orchestrator.sandbox.docker_admin import DockerBackend
from tests.helpers.backend_config import TAG


@pytest.mark.parametrize(
    "spelling",
    [
        dict(image=TAG, runtime="runsc"),
        dict(backend="docker", image=TAG, runtime="runsc"),
        dict(backend={"kind": "docker", "image": TAG, "runtime": "runsc"}),
        dict(backend={"kind": "docker", "image": TAG}, runtime="runsc"),
        dict(backend=DockerBackendConfig(image=TAG), runtime="runsc"),
        dict(backend=DockerBackendConfig(image=TAG, runtime="runsc")),
        dict(backend={"image": TAG, "runtime": "runsc"}),  # no kind: the default backend's
    ],
)
def test_every_spelling_is_the_docker_backends_config(spelling):
    config = SandboxConfig(**spelling, memory="2g")
    assert config.backend == DockerBackendConfig(kind="docker", image=TAG, runtime="runsc") and config.memory == "2g"
    assert SandboxConfig.model_validate_json(config.model_dump_json()) == config  # what is written reads back the same


def test_the_default_backend_is_docker_with_the_default_image():
    assert SandboxConfig().backend == DockerBackendConfig() and SandboxConfig().backend.kind == "docker"


@pytest.mark.parametrize(
    "spelling, says",
    [
        (dict(backend="podman"), "'podman'"),
        (dict(backend={"kind": "kubernetes"}), "'kubernetes'"),
        (dict(backend={"kind": "docker", "imag": TAG}), "imag"),
        (dict(backend=42), "backend"),
    ],
)
def test_a_backend_that_does_not_exist_or_a_key_it_does_not_have_is_refused(spelling, says):
    with pytest.raises(ValueError) as refused:
        SandboxConfig(**spelling)
    assert says in str(refused.value)


def test_a_copy_puts_flat_keys_into_the_backend_and_refuses_keys_nothing_has():
    config = SandboxConfig(runtime="runc", memory="2g")
    copy = config.model_copy(update={"runtime": "runsc", "user": "1000:1000"})
    assert copy.backend.runtime == "runsc" and copy.user == "1000:1000" and copy.memory == "2g"
    assert config.backend.runtime == "runc" and config.user is None  # the original is untouched
    with pytest.raises(TypeError, match="runtme"):
        config.model_copy(update={"runtme": "runsc"})  # pydantic's own copy would set it and keep runc
    with pytest.raises(ValueError, match="imag"):
        config.with_backend(imag=TAG)
    assert config.with_backend(image=TAG).backend == DockerBackendConfig(image=TAG, runtime="runc")


def test_the_backend_is_made_from_its_own_config():
    config = SandboxConfig(image=TAG)
    backend = backend_from_config(config)
    assert (
        isinstance(backend, DockerBackend) and backend.options == config.backend
    )  # image build's default tag is this image


def test_the_docker_backend_refuses_another_backends_config():
    class Other(BaseModel):
        kind: str = "elsewhere"

    stray = SandboxConfig.model_construct(backend=Other())  # what a caller skipping backend_from_config could hand it
    with pytest.raises(OpenAgentsError) as refused:
        docker_options(stray)
    assert refused.value.type is ErrorType.CONFIG_INVALID and "'elsewhere'" in refused.value.message


def test_the_cli_flags_build_the_docker_config():
    from orchestrator.cli.common import build_config

    config = build_config(TAG, "2g", None, None, (), "runsc", None)
    assert config.backend == DockerBackendConfig(image=TAG, runtime="runsc") and config.memory == "2g"
