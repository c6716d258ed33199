"""The Ray engine (`--engine ray`, the `ray` extra): each task is a Ray task that runs one session,
with the same code as the local engine (runner.run_task), on a node that has Docker and the image.

- **Where**: a task asks for one unit of a custom resource (`oa_sandbox` by default). A node
  offers it when it can run boxes, as many units as boxes it holds
  (`ray start --resources='{"oa_sandbox": 8}'`), so no node takes more boxes than it declared and a
  node without Docker takes none. The task itself takes no CPU of Ray's (its box has its own limit).
- **A node lost mid-task**: Ray runs the task again elsewhere, at most `max_retries` times (only
  for a lost worker or node, never for the task's own failure: that is a typed result). Each
  attempt checks in with a small ledger actor on the head node at its start, so the result
  says how many attempts it took (`attempts`, `retried`, `nodes_tried`). Each attempt first reaps
  the boxes of owners that are gone on its node (a lost attempt's box, where the node survived).
- **Results**: streamed back with ray.wait in completion order and appended to --out as each arrives.
- **Ctrl-C**: every task still in Ray is cancelled (a running one gets KeyboardInterrupt: its
  session ends cancelled and its box is removed), the driver waits for them, then disconnects.

Every Ray process of a test stays on loopback: RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 is set before
Ray is imported (without it the driver rewrites 127.0.0.1 to the machine's address and cannot
reach a GCS bound to loopback), and a loopback --ray-address makes the driver's node address
127.0.0.1 too.
"""

from __future__ import annotations

import ipaddress
import os
import time
from typing import Any

from ..errors import ErrorType, OpenAgentsError
from .local import Outcome, Progress, ignore_interrupts, interrupt_once
from .runner import BatchSettings, run_task
from .tasks import BatchTask, ResultWriter, TaskResult

HEAD_RESOURCE = "node:__internal_head__"  # what Ray gives the head node alone
CANCEL_WAIT_S = 120.0  # after Ctrl-C, how long the driver waits for the cancelled sessions to remove their boxes


class Ledger:
    """The attempts of each task: which node started it, in order (a Ray actor on the driver's node)."""

    def __init__(self) -> None:
        self.tried: dict[str, list[str]] = {}

    def begin(self, task_id: str, node: str) -> int:
        self.tried.setdefault(task_id, []).append(node)
        return len(self.tried[task_id])

    def attempts(self, task_id: str) -> list[str]:
        return list(self.tried.get(task_id, []))


def ray_attempt(task: dict[str, Any], settings: dict[str, Any], ledger: Any) -> dict[str, Any]:
    """One attempt of one task, on whatever node Ray chose. Runs in a Ray worker."""
    import ray

    from ..sandbox import reaper
    from ..sandbox.docker import docker_client
    from .runner import this_node

    parsed = BatchTask.model_validate(task)
    node = f"{this_node()}/{ray.get_runtime_context().get_node_id()[:12]}"
    try:
        ray.get(ledger.begin.remote(parsed.id, node), timeout=30)
    except Exception:  # noqa: BLE001 - the ledger only counts attempts: the task runs without it
        pass
    try:  # a box of an earlier attempt whose worker died with its raylet, when the node survived
        reaper.reap(docker_client(timeout=30), reaper.Scope.LEFTOVERS)
    except Exception:  # noqa: BLE001 - never fatal: the session's own client says what is wrong
        pass
    result = run_task(parsed, BatchSettings.model_validate(settings), node=node)
    return result.model_dump(mode="json")


def _loopback(address: str | None) -> bool:
    if not address:
        return False
    host = address.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _connect(address: str | None) -> Any:
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:
        import ray
    except ImportError:
        raise OpenAgentsError(
            ErrorType.CONFIG_INVALID, "--engine ray needs Ray: pip install 'openagents-sandbox[ray]'"
        ) from None
    if not address:
        raise OpenAgentsError(
            ErrorType.CONFIG_INVALID, "--engine ray needs --ray-address HOST:PORT (the cluster's GCS), or auto"
        )
    kwargs: dict[str, Any] = {
        "address": address,
        "log_to_driver": False,
        "logging_level": "ERROR",
        "configure_logging": False,
    }
    if _loopback(address):
        kwargs["_node_ip_address"] = "127.0.0.1"
    try:
        ray.init(**kwargs)
    except Exception as err:  # noqa: BLE001 - ray raises ConnectionError, RuntimeError, ValueError by version
        raise OpenAgentsError(
            ErrorType.CONFIG_INVALID, f"cannot connect to the Ray cluster at {address}: {str(err)[:300]}"
        ) from None
    return ray


def _ray_error(task_id: str, err: BaseException, ray: Any, max_retries: int) -> TaskResult:
    if isinstance(err, ray.exceptions.TaskCancelledError):
        return TaskResult.failed(
            task_id, "cancelled", OpenAgentsError(ErrorType.CANCELLED, "the batch was cancelled"), exit_code=130
        )
    if isinstance(
        err, (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError, ray.exceptions.LocalRayletDiedError)
    ):
        message = (
            f"the Ray worker or node running it was lost, and the {max_retries} retries with it: {type(err).__name__}"
        )
        return TaskResult.failed(task_id, "error", OpenAgentsError(ErrorType.AGENT_LOST, message), exit_code=2)
    return TaskResult.failed(
        task_id,
        "error",
        OpenAgentsError(ErrorType.INTERNAL_ERROR, f"{type(err).__name__}: {str(err)[:500]}"),
        exit_code=2,
    )


def run_ray(
    tasks: list[BatchTask],
    settings: BatchSettings,
    writer: ResultWriter,
    progress: Progress,
    address: str | None,
    resource: str = "oa_sandbox",
    max_retries: int = 2,
    concurrency: int | None = None,
) -> Outcome:
    ray = _connect(address)
    outcome = Outcome()
    try:
        offered = ray.cluster_resources().get(resource, 0)
        if offered < 1:
            raise OpenAgentsError(
                ErrorType.CONFIG_INVALID,
                f"no node of the Ray cluster at {address} offers the resource {resource!r}: "
                f"start each node that has Docker and the sandbox image with "
                f"`ray start --resources='{{\"{resource}\": N}}'` (N: the boxes it holds)",
            )
        # The ledger lives on the head node (its loss is the cluster's): not the driver's node,
        # which may be any worker when several share an address (and a worker may be lost).
        ledger = ray.remote(num_cpus=0, resources={HEAD_RESOURCE: 0.001}, max_restarts=0)(Ledger).remote()
        attempt = ray.remote(num_cpus=0, resources={resource: 1}, max_retries=max_retries, retry_exceptions=False)(
            ray_attempt
        )
        settings_json = settings.model_dump(mode="json")
        queue = list(tasks)
        in_flight: dict[Any, BatchTask] = {}
        limit = concurrency or len(tasks)
        interrupt_once()
        try:
            while queue or in_flight:
                while queue and len(in_flight) < limit:
                    task = queue.pop(0)
                    in_flight[
                        attempt.options(name=f"oa-batch:{task.id}").remote(
                            task.model_dump(mode="json"), settings_json, ledger
                        )
                    ] = task
                ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=0.5)
                for ref in ready:
                    task = in_flight.pop(ref)
                    _record(outcome, writer, progress, _collect(ray, ref, task, ledger, max_retries))
                progress.update(len(in_flight))
        except KeyboardInterrupt:
            ignore_interrupts()
            outcome.interrupted = True
            for ref in in_flight:
                ray.cancel(ref, force=False)  # a running session gets KeyboardInterrupt: cancelled, its box removed
            deadline = time.monotonic() + CANCEL_WAIT_S
            while in_flight and time.monotonic() < deadline:
                ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=1.0)
                for ref in ready:
                    task = in_flight.pop(ref)
                    result = _collect(ray, ref, task, ledger, max_retries)
                    if (
                        result.status != "cancelled" or result.session_id
                    ):  # one that never started is not written: a rerun runs it
                        _record(outcome, writer, progress, result)
    finally:
        ray.shutdown()
    return outcome


def _collect(ray: Any, ref: Any, task: BatchTask, ledger: Any, max_retries: int) -> TaskResult:
    try:
        result = TaskResult.model_validate(ray.get(ref))
    except ray.exceptions.RayError as err:
        result = _ray_error(task.id, err, ray, max_retries)
    try:
        tried = ray.get(ledger.attempts.remote(task.id), timeout=30)
    except Exception:  # noqa: BLE001 - the result stands without its attempts
        tried = []
    if tried:
        result.attempts = len(tried)
        result.retried = len(tried) > 1
        result.nodes_tried = tried[:-1] if result.node else tried
        if not result.node:
            result.node = tried[-1]
    return result


def _record(outcome: Outcome, writer: ResultWriter, progress: Progress, result: TaskResult) -> None:
    writer.write(result)
    outcome.results.append(result)
    progress.finished(result)
