"""Sandboxes: how one is started (a Deployment, one module per backend: docker.py) apart from how
calls run in it (base.py's SupervisedSandbox over channel.py). Callers use backend_from_config()."""
from .backend import Backend, backend_from_config
from .base import Deployment, Sandbox, SupervisedSandbox
from .docker import DockerSandbox

__all__ = ["Backend", "Deployment", "DockerSandbox", "Sandbox", "SupervisedSandbox", "backend_from_config"]
