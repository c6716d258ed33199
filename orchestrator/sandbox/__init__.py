"""Sandboxes: how one is started (deployment) apart from how calls run in it (channel)."""
from .deployment import Sandbox
from .docker import DockerSandbox

__all__ = ["Sandbox", "DockerSandbox"]
