"""Sandboxes: how one is started (a Deployment, one module per backend: docker.py) apart from how
calls run in it (base.py's SupervisedSandbox over channel.py). Callers make a backend from the
config with backend.py's backend_from_config(). Nothing is imported here: importing one module of
the package (the owner labels, the reaper) must not load every backend."""
