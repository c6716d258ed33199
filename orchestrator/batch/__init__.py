"""Batch runs: many tasks, each a session on its own copy of its workspace, on this machine's
threads (local.py) or as Ray tasks across machines (ray_engine.py); runner.py runs one session
for both, tasks.py reads task lines and writes result lines, command.py is `oa-sandbox batch`."""
