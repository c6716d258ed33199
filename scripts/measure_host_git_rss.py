"""Peak host RSS of the git tool over a few hundred MB of changed (incompressible) files.

    .venv/bin/python scripts/measure_host_git_rss.py [MB_PER_FILE] [FILES]

Builds a throw-away repository in a temporary directory, changes FILES files of MB_PER_FILE MB
each, runs status, diff and commit through the host tool, and prints the peak RSS growth of this
process (ru_maxrss) for each. The old tool (the git program) buffered the whole diff: 2.9 GB of
host RSS for 900 MB of files.
"""

from __future__ import annotations

import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pygit2  # noqa: E402

from orchestrator.tools.host_git import HostRepo, parse_args  # noqa: E402


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    mb = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp) / "ws"
        ws.mkdir()
        repo = pygit2.init_repository(str(ws), initial_head="main")
        index = repo.index
        for i in range(count):
            (ws / f"big{i}.bin").write_bytes(b"old\n")
            index.add(f"big{i}.bin")
        index.write()
        sig = pygit2.Signature("m", "m@example.invalid")
        repo.create_commit("HEAD", sig, sig, "init", index.write_tree(), [])
        del repo, index
        for i in range(count):
            with open(ws / f"big{i}.bin", "wb") as f:
                for _ in range(mb):
                    f.write(os.urandom(1 << 20))
        host = HostRepo.open_at_start(ws)
        assert host is not None
        base = peak_mib()
        print(f"{count} changed files of {mb} MB ({count * mb} MB); baseline peak RSS {base:.0f} MiB")
        for sub in ("status", "diff", "commit", "status"):  # the last status hashes every file (same sizes)
            started = time.monotonic()
            result = host.run(parse_args({"subcommand": sub, **({"message": "big"} if sub == "commit" else {})}))
            print(
                f"  git {sub:<6} ok={result.ok} output={len(result.output)} chars  "
                f"{time.monotonic() - started:5.1f}s  peak RSS {peak_mib():.0f} MiB (+{peak_mib() - base:.0f})"
            )


if __name__ == "__main__":
    main()
