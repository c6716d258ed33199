"""`oa-sandbox acp`, `oa-sandbox mcp` and `oa-sandbox batch`: the front-ends other programs drive
(an editor, an agent, a CI job); stdout belongs to their protocol, so everything else goes to stderr."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import click

from ..config import DEFAULT_MAX_TURNS, SandboxConfig
from ..errors import ErrorType, OpenAgentsError
from ..models.dialects import MODEL_FORMS
from .attempts import best_of_options
from .common import (
    build_config,
    copy_options,
    load_defaults,
    new_transcript_path,
    sandbox_options,
    setup_error,
    terminate_as_interrupt,
)

if TYPE_CHECKING:
    from ..acp.approver import AcpApprover
    from ..api import Sandbox
    from ..sandbox.pool import PoolEvent
    from ..tools.registry import HostTools
    from ..workspace.copy import CopyLimits
    from ..workspace.records import SessionRecord, WorkspaceMode


def _pool_progress(event: PoolEvent) -> None:
    """The warm pool's refills on stderr (stdout is the protocol's): a refill waiting in the start
    line, each box made ready when -v is given; a failed start is logged by the pool itself."""
    from ..sandbox.pool import PoolBoxReady
    from ..sandbox.starts import StartQueued

    if isinstance(event, StartQueued) and not event.slot_taken:
        click.echo(
            f"oa-sandbox: pool: a refill waits for a start slot: {event.ahead} ahead, "
            f"{event.starting} of {event.limit} starting",
            err=True,
        )
    elif isinstance(event, PoolBoxReady):
        logging.getLogger(__name__).debug(
            "pool: %d of %d sandboxes ready, %d claims waiting", event.ready, event.size, event.waiting_claims
        )


@click.command()
@click.option(
    "--workspace",
    default=None,
    type=click.Path(exists=True, file_okay=False),
    help="Mount this instead of each session's cwd.",
)
@click.option("--model", "model_spec", default=None, help=f"{MODEL_FORMS} (default: `model` in the config file).")
@click.option("--base-url", default=None)
@click.option("--api-key-env", default=None, metavar="VAR")
@click.option(
    "--policy",
    "policies",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Policy file (repeatable; default: `policy` in the config file).",
)
@click.option("--transcript-dir", default=None, type=click.Path(file_okay=False), help="Where session transcripts go.")
@click.option(
    "--max-turns", default=None, type=click.IntRange(1, 10_000), help=f"Turns per prompt (default {DEFAULT_MAX_TURNS})."
)
@click.option(
    "--model-timeout",
    default=None,
    type=click.FloatRange(0, None, min_open=True),
    metavar="SECONDS",
    help="The longest the model server may stay silent (default 300).",
)
@click.option(
    "--pool",
    default=0,
    show_default=True,
    type=click.IntRange(0, 32),
    help="Keep N sandboxes of --workspace warm, so a session starts at once.",
)
@sandbox_options
def acp(
    workspace: str | None,
    model_spec: str | None,
    base_url: str | None,
    api_key_env: str | None,
    policies: tuple[str, ...],
    transcript_dir: str | None,
    max_turns: int | None,
    model_timeout: float | None,
    pool: int,
    config: SandboxConfig,
    mode: WorkspaceMode,
    copy_limits: CopyLimits,
) -> None:
    """Speak the Agent Client Protocol on stdin/stdout, for editors (Zed and others)."""
    from ..acp.server import AcpServer
    from ..api import Sandbox, SandboxOptions
    from ..api.pool import warm_pool
    from ..models.factory import model_from_spec
    from ..sandbox import lifetime
    from ..state import new_id
    from .user_config import session_fields  # the config file's module: only when a command runs

    logging.getLogger().handlers[:] = [logging.StreamHandler(sys.stderr)]  # stdout is the protocol's
    lifetime.install()  # here, on the main thread: sessions and the pool start their boxes on others
    defaults = load_defaults(workspace)  # the config file's values, as `run` reads them; a flag given wins
    model_spec = model_spec or defaults.model
    if not model_spec:
        raise setup_error(
            OpenAgentsError(
                ErrorType.CONFIG_INVALID, f"no model: pass --model ({MODEL_FORMS}) or set model in the config file"
            )
        )
    try:  # the one options type, validated once (typed): the flags over the config file's keys
        options = SandboxOptions.of(
            None,
            {
                "config": config,
                "mode": mode.value,
                **copy_options(copy_limits),
                **session_fields(
                    defaults,
                    model=model_spec,
                    base_url=base_url,
                    api_key_env=api_key_env,
                    policy_files=list(policies),
                    max_turns=max_turns,
                    model_timeout_s=model_timeout,
                ),
            },
        )
    except OpenAgentsError as err:
        raise setup_error(err) from None
    try:
        model_from_spec(
            model_spec, base_url=options.base_url, api_key_env=options.api_key_env
        )  # fail fast on a missing key
    except OpenAgentsError as err:
        raise setup_error(err) from None

    warm = None
    if pool:
        if not workspace:
            raise click.BadParameter("a warm pool needs a fixed --workspace", param_hint="--pool")
        ws = Path(workspace).resolve()
        try:
            warm = warm_pool(ws, options, pool, _pool_progress)
        except OpenAgentsError as err:
            raise setup_error(err) from None
        warm.start()

    def start(
        ws: Path,
        approver: AcpApprover,
        on_event: Callable[[dict[str, Any]], None],
        host_tools: HostTools | None,
        resume: SessionRecord | None = None,
    ) -> Sandbox:
        own: dict[str, Any] = {"approver": approver, "on_record": on_event, "host_tools": host_tools}
        if (
            resume is not None
        ):  # session/load: its own transcript, workspace and mode; its model and policy files unless given here
            files = options.policy_files or [Path(p) for p in resume.policy_files]
            return Sandbox(  # it goes on in its record's mode, whatever --workspace-mode says
                ws, options, kind="acp", **own, resume=resume.id, policy_files=files, mode="auto"
            ).open()
        path = Path(transcript_dir) / f"acp-{new_id()}.jsonl" if transcript_dir else None
        return Sandbox(ws, options, kind="acp", box=warm.claim() if warm else None, **own, transcript=path).open()

    try:
        AcpServer(start, workspace=Path(workspace) if workspace else None).serve()
    finally:
        if warm:
            warm.close()


@click.command()
@click.option(
    "--workspace",
    default=".",
    show_default=True,
    type=click.Path(exists=True, file_okay=False),
    help="Directory mounted at /workspace.",
)
@click.option(
    "--policy",
    "policies",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Policy file, TOML or YAML (repeatable).",
)
@click.option(
    "--transcript",
    "transcript_path",
    default=None,
    type=click.Path(dir_okay=False),
    help="Where to write the JSONL transcript.",
)
@sandbox_options
def mcp(
    workspace: str,
    policies: tuple[str, ...],
    transcript_path: str | None,
    config: SandboxConfig,
    mode: WorkspaceMode,
    copy_limits: CopyLimits,
) -> None:
    """Serve the six sandboxed tools over MCP stdio (register with Claude Code, Codex, Gemini CLI)."""
    from ..api import Sandbox, SandboxOptions
    from ..ground.text import visible
    from ..mcp.server import McpApprover, serve

    logging.getLogger().handlers[:] = [logging.StreamHandler(sys.stderr)]  # stdout is the protocol's
    terminate_as_interrupt()  # a SIGTERM while the box starts removes it too
    approver = McpApprover()
    try:  # no model: the MCP client makes the calls, and may call changes/apply_changes in copy mode
        options = SandboxOptions(
            config=config,
            mode=mode.value,
            **copy_options(copy_limits),
            policy_files=[Path(p) for p in policies],
            approver=approver,
            transcript=new_transcript_path(transcript_path),
        )
        box = Sandbox(Path(workspace), options, kind="mcp", any_caller_lands=True).open()
    except OpenAgentsError as err:
        raise setup_error(err) from None
    for line in serve(box, approver):
        click.echo(visible(f"oa-sandbox: integrity sweep: {line}"), err=True)
    record = box.record
    click.echo(f"oa-sandbox: session {record.id} ({record.mode.value} mode), transcript {record.transcript}", err=True)
    if record.mode.value == "copy":
        click.echo(
            f"oa-sandbox: review with `oa-sandbox changes {record.id}`, apply with `oa-sandbox apply {record.id}`",
            err=True,
        )


@click.command(
    epilog="Exit codes: 0 every task finished; 1 at least one did not (stopped, error, invalid line); "
    "2 set-up error; 130 interrupted (no box left behind)."
)
@click.argument("tasks_file", metavar="TASKS.jsonl", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--out",
    required=True,
    type=click.Path(dir_okay=False),
    help="RESULTS.jsonl: one line appended per task as it ends; a rerun skips the ids it has finished or stopped.",
)
@click.option(
    "--concurrency",
    type=click.IntRange(1, 1024),
    default=None,
    metavar="N",
    help="Sessions at once (default: from cores and memory; starts still go through the start gate).",
)
@click.option("--model", "model_spec", default=None, help=f"For tasks without `model`: {MODEL_FORMS}.")
@click.option("--base-url", default=None)
@click.option("--api-key-env", default=None, metavar="VAR")
@click.option(
    "--policy",
    "policies",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="For tasks without `policy` (repeatable).",
)
@click.option(
    "--auto-approve",
    is_flag=True,
    help="Everything inside each sandbox proceeds without asking (a policy's deny still wins).",
)
@click.option(
    "--max-turns",
    default=None,
    type=click.IntRange(1, 10_000),
    help=f"For tasks without `max_turns` (default {DEFAULT_MAX_TURNS}).",
)
@click.option(
    "--max-wall",
    default=None,
    type=click.FloatRange(0, None, min_open=True),
    metavar="SECONDS",
    help="For tasks without `max_wall`.",
)
@click.option("--max-tokens", default=None, type=click.IntRange(1, None), help="Per task.")
@click.option("--runtime", default=None, help="For tasks without `runtime`: runc or runsc.")
@click.option("--image", default=None, help="Sandbox image (default openagents-sandbox:latest).")
@click.option("--memory", default=None, help="Memory limit of each box, e.g. 1g.")
@click.option("--cpus", type=float, default=None, help="CPU share of each box.")
@click.option(
    "--start-concurrency",
    type=click.IntRange(1, 256),
    default=None,
    metavar="N",
    help="Sandbox starts at once (default 4).",
)
@click.option("--engine", type=click.Choice(["local", "ray"]), default="local", show_default=True)
@click.option(
    "--ray-address", default=None, metavar="ADDRESS", help="--engine ray: the cluster's address (HOST:PORT, or auto)."
)
@click.option(
    "--ray-resource",
    default="oa_sandbox",
    show_default=True,
    metavar="NAME",
    help="--engine ray: the custom resource a node offers per box it holds.",
)
@click.option(
    "--max-retries",
    default=2,
    show_default=True,
    type=click.IntRange(0, 10),
    help="--engine ray: reruns of a task whose node was lost.",
)
@best_of_options("each task without `attempts` and `pick`")
def batch(
    tasks_file: str,
    out: str,
    concurrency: int | None,
    model_spec: str | None,
    base_url: str | None,
    api_key_env: str | None,
    policies: tuple[str, ...],
    auto_approve: bool,
    max_turns: int | None,
    max_wall: float | None,
    max_tokens: int | None,
    runtime: str | None,
    image: str | None,
    memory: str | None,
    cpus: float | None,
    start_concurrency: int | None,
    engine: str,
    ray_address: str | None,
    ray_resource: str,
    max_retries: int,
    attempts: int,
    pick: str | None,
    pick_timeout: int,
) -> None:
    """Run every task of TASKS.jsonl (id, workspace, task; optional model, policy, max_turns,
    max_wall, runtime, attempts and pick), each on its own copy of its workspace; one result line
    each in --out (status, exit_code, session_id, patch, left_out, tokens, wall_s, error, node,
    best_of)."""
    from ..api import SandboxOptions
    from ..batch.command import BatchRequest, run_batch
    from ..batch.runner import BatchSettings
    from .user_config import session_fields

    defaults = load_defaults()
    config = build_config(
        image or defaults.image,
        memory or defaults.memory,
        defaults.pids,
        cpus or defaults.cpus,
        (),
        runtime or defaults.runtime,
        None,
        start_concurrency=start_concurrency or defaults.start_concurrency,
    )
    settings = BatchSettings(
        options=SandboxOptions(
            config=config,
            mode="copy",
            git=False,
            auto_approve=auto_approve,
            **session_fields(  # the flags over the config file's keys, as SandboxOptions names them
                defaults,
                model=model_spec,
                base_url=base_url,
                api_key_env=api_key_env,
                policy_files=[Path(p).resolve() for p in policies],
                max_turns=max_turns,
                max_wall_s=max_wall,
                max_tokens=max_tokens,
            ),
        ),
        attempts=attempts,
        pick=pick,
        pick_timeout=pick_timeout,
    )
    request = BatchRequest(
        Path(tasks_file),
        Path(out),
        settings,
        concurrency=concurrency,
        engine=engine,
        ray_address=ray_address,
        ray_resource=ray_resource,
        max_retries=max_retries,
    )
    try:
        code = run_batch(request)
    except OpenAgentsError as err:
        raise setup_error(err) from None
    raise click.exceptions.Exit(code)
