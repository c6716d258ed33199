"""`oa-sandbox batch TASKS.jsonl --out RESULTS.jsonl`: read the tasks, skip what --out already has
finished, write each bad line's typed result, run the rest on the chosen engine.

Exit codes: 0 every task finished (status `finished`), 1 at least one did not (stopped, error,
invalid), 2 a set-up error before any task ran (the tasks file, the output file, Ray), 130
interrupted (Ctrl-C, SIGTERM, SIGHUP): nothing left running, no box left behind.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..config import SandboxConfig
from ..errors import OpenAgentsError
from .runner import BatchSettings
from .tasks import BadLine, BatchTask, ResultWriter, TaskResult, finished_ids, parse_tasks

EXIT_ALL_FINISHED, EXIT_NOT_ALL, EXIT_SETUP, EXIT_INTERRUPTED = 0, 1, 2, 130


@dataclass
class BatchRequest:
    tasks_file: Path
    out: Path
    settings: BatchSettings
    concurrency: int | None = None
    engine: str = "local"  # local | ray
    ray_address: str | None = None
    ray_resource: str = "oa_sandbox"
    max_retries: int = 2


def run_batch(request: BatchRequest) -> int:
    """Raises OpenAgentsError for a set-up error (the CLI says it and exits 2)."""
    from ..sandbox import lifetime
    from .local import Progress, default_concurrency, ignore_interrupts, interrupt_once, run_local

    lines = parse_tasks(request.tasks_file)
    done = finished_ids(request.out)
    todo: list[BatchTask] = []
    bad: list[TaskResult] = []
    skipped = 0
    for item in lines:
        task_id = item.result.id if isinstance(item, BadLine) else item.id
        if task_id in done:
            skipped += 1
        elif isinstance(item, BadLine):
            bad.append(item.result)
        else:
            todo.append(item)
    try:
        writer = ResultWriter(request.out)
    except OSError as err:
        from ..errors import ErrorType

        raise OpenAgentsError(ErrorType.IO_ERROR, f"cannot append to {request.out}: {err.strerror}") from None
    progress = Progress(total=len(todo) + len(bad), skipped=skipped)
    interrupted = False
    results: list[TaskResult] = []
    try:
        for result in bad:
            writer.write(result)
            progress.finished(result)
            results.append(result)
        if todo:
            if request.engine == "ray":
                from .ray_engine import run_ray

                outcome = run_ray(
                    todo,
                    request.settings,
                    writer,
                    progress,
                    address=request.ray_address,
                    resource=request.ray_resource,
                    max_retries=request.max_retries,
                    concurrency=request.concurrency,
                )
            else:
                lifetime.install()  # on the main thread: the sessions start their boxes on the pool's threads
                interrupt_once()
                concurrency = request.concurrency or default_concurrency(
                    (request.settings.options.config or SandboxConfig()).memory,
                    (request.settings.options.config or SandboxConfig()).cpus,
                )
                outcome = run_local(todo, request.settings, writer, concurrency, progress)
            results += outcome.results
            interrupted = outcome.interrupted
    finally:
        ignore_interrupts()
        writer.close()
        progress.close(str(request.out), interrupted)
    if interrupted:
        return EXIT_INTERRUPTED
    return EXIT_ALL_FINISHED if all(r.status == "finished" for r in results) else EXIT_NOT_ALL
