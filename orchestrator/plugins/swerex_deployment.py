"""SWE-ReX's deployment on our box: `OpenAgentsDeployment` implements
`swerex.deployment.abstract.AbstractDeployment` (async `start`, `stop`, `is_alive`, `runtime`),
opening one `AsyncSandbox` (the public API) and handing out an `OpenAgentsRuntime` on it.

Installed with `pip install 'openagents-sandbox[swerex]'`. SWE-ReX has no plug-in discovery: its
`DeploymentConfig` is a closed union of its own config classes, told apart by a `type` field. So
`OpenAgentsDeploymentConfig` follows their shape (`type: "openagents"`, `get_deployment()`) for
code that takes any such config by duck typing, and programs build the deployment by its import
path (docs/api.md, SWE-ReX). Without a `workspace`, the box works on an empty private directory
(copy mode) removed at `stop`, like SWE-ReX's own docker deployment starts from a clean image.
"""

from __future__ import annotations

import logging
import tempfile
import weakref
from pathlib import Path
from typing import Any, Literal

from swerex.deployment.abstract import AbstractDeployment
from swerex.deployment.hooks.abstract import CombinedDeploymentHook, DeploymentHook
from swerex.exceptions import DeploymentNotStartedError, DeploymentStartupError
from swerex.runtime.abstract import IsAliveResponse

from .. import AsyncSandbox, OpenAgentsError
from ..boxfs import remove_path
from .settings import BoxSettings
from .swerex_runtime import OpenAgentsRuntime


class OpenAgentsDeploymentConfig(BoxSettings):
    """The deployment's settings: these and the box's (BoxSettings)."""

    type: Literal["openagents"] = "openagents"  # SWE-ReX's discriminator field, as its own configs have it
    workspace: str | None = None  # the host directory (/workspace in the box); None: a fresh empty one, removed at stop
    mode: Literal["auto", "bind", "copy"] = "copy"
    auto_approve: bool = True  # commands inside the box run without asking; a policy's deny still refuses them

    def get_deployment(self) -> "OpenAgentsDeployment":
        return OpenAgentsDeployment.from_config(self)


class OpenAgentsDeployment(AbstractDeployment):
    """`deployment = OpenAgentsDeployment(workspace="repo"); await deployment.start();
    await deployment.runtime.execute(Command(...)); await deployment.stop()`."""

    def __init__(self, *, logger: logging.Logger | None = None, **kwargs: Any) -> None:
        self._config = OpenAgentsDeploymentConfig(**kwargs)
        self.logger = logger or logging.getLogger("rex-deploy.openagents")
        self._hooks = CombinedDeploymentHook()
        self._box: AsyncSandbox | None = None
        self._runtime: OpenAgentsRuntime | None = None
        self._scratch: Path | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None

    @classmethod
    def from_config(cls, config: OpenAgentsDeploymentConfig) -> "OpenAgentsDeployment":
        return cls(**config.model_dump(exclude={"type"}))

    def add_hook(self, hook: DeploymentHook) -> None:
        self._hooks.add_hook(hook)

    @property
    def config(self) -> OpenAgentsDeploymentConfig:
        return self._config

    @property
    def sandbox(self) -> AsyncSandbox:
        """The open AsyncSandbox (for `changes()`, `apply()`, `id`); DeploymentNotStartedError before start."""
        if self._box is None:
            raise DeploymentNotStartedError()  # type: ignore[no-untyped-call]  # SWE-ReX leaves its __init__ untyped
        return self._box

    @property
    def runtime(self) -> OpenAgentsRuntime:
        if self._runtime is None:
            raise DeploymentNotStartedError()  # type: ignore[no-untyped-call]  # SWE-ReX leaves its __init__ untyped
        return self._runtime

    async def is_alive(self, *, timeout: float | None = None) -> IsAliveResponse:
        return await self.runtime.is_alive(timeout=timeout)

    async def start(self) -> None:
        """Open the box (a second start while running is a no-op). Failing, it leaves nothing
        behind and raises DeploymentStartupError carrying the sandbox's typed error as its cause."""
        if self._box is not None:
            return
        config = self._config
        self._hooks.on_custom_step("Starting the openagents sandbox")
        if config.workspace is None:
            self._scratch = Path(tempfile.mkdtemp(prefix="oa-swerex-"))
        workspace = self._scratch or Path(config.workspace or ".")
        box = AsyncSandbox(
            workspace,
            mode="copy" if self._scratch else config.mode,
            auto_approve=config.auto_approve,
            approve="ask",
            policy_files=config.policy_paths(),
            kind="swerex",
            **config.box_options(),
        )
        try:
            await box.open()
        except OpenAgentsError as err:
            self._remove_scratch()
            raise DeploymentStartupError(
                f"the openagents sandbox did not start: {err.type.value}: {err.message}"
            ) from err
        except BaseException:
            self._remove_scratch()
            raise
        self._box, self._runtime = box, OpenAgentsRuntime(box, logger=self.logger)
        self._finalizer = weakref.finalize(self, _release, box, self._scratch)

    async def stop(self) -> None:
        """Remove the box and its egress gate (idempotent). A scratch workspace goes with its copy;
        a given workspace's copy stays for review (`oa-sandbox changes ID`), as the API's close keeps it."""
        box, runtime = self._box, self._runtime
        self._box = self._runtime = None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        try:
            if runtime is not None:
                await runtime.close()
            if box is not None and not box.closed:
                await (box.discard() if self._scratch is not None else box.close())
        finally:
            self._remove_scratch()

    def _remove_scratch(self) -> None:
        if self._scratch is not None:
            remove_path(self._scratch)
            self._scratch = None

    def __del__(self) -> None:
        """SWE-ReX's base stops the deployment from __del__ through an event loop; ours closes a box
        still open synchronously (no loop needed), and so does the interpreter's exit (finalize)."""
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer()


def _release(box: AsyncSandbox, scratch: Path | None) -> None:
    """A deployment never stopped: its box closed, its scratch workspace removed."""
    try:
        if not box.closed:
            box.sync.close()
    finally:
        if scratch is not None:
            remove_path(scratch)
