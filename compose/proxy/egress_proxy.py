"""The egress gate's entry point in its container (Dockerfile): settings from the environment, the
start line, the mark signals, then one thread per connection. What the gate does and why is in
egress_gate/ (its __init__ says which module holds which job)."""

from __future__ import annotations

import os
import sys

# Run as `python3 -I -S egress_proxy.py`: isolated mode puts neither the script's folder nor any
# site folder on sys.path, so the package beside it (root-owned, read-only in the image) is added here.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from egress_gate.handler import Server  # noqa: E402
from egress_gate.settings import Settings  # noqa: E402


def main() -> None:
    settings = Settings.from_environment()
    policy = settings.policy
    settings.audit.log(
        decision="start",
        rule_set=policy.rule_set,
        rules=[r.describe() for r in policy.rules][:50],
        cidrs=[str(c) for c in policy.cidrs],
        intercepted=sorted(settings.intercept),
        credentials=[f"{c.host}:{c.port}{c.path_prefix} {c.header}" for c in settings.credentials],
    )
    # after the start line: a mark never interleaves with a line the main thread writes
    settings.audit.listen_for_marks()
    with Server(("0.0.0.0", int(os.environ.get("OA_EGRESS_PORT", 3128))), settings) as server:
        server.serve_forever()


if __name__ == "__main__":
    main()
