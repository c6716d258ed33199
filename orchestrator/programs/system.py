"""The system's own programs the product runs on the host (issue 49: every host program is found
once, outside every box root): `openssl` for the session CA (sandbox/egress_tls.py), `runsc
--version` on a runtime the daemon registered by name (sandbox/runtimes.py), `debootstrap` and
`tar` for the base image (sandbox/image.py). Each comes from the system's directories, never the
user's PATH (an activated venv in the workspace, direnv's PATH_add and node_modules/.bin are where
the box writes), and runs with an environment that names nothing else: that PATH, and no
variable of the user's that could point it at a file the box wrote (OPENSSL_CONF, LD_PRELOAD, ...)."""

from __future__ import annotations

import os
import shutil

from ..errors import ErrorType, OpenAgentsError

SYSTEM_DIRS = (
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # as systemd gives a service (dockerd's PATH)
)
KEPT = ("LANG", "LC_ALL", "LC_CTYPE", "TZ")


def find(name: str, why: str, dirs: str = SYSTEM_DIRS) -> str:
    """`name` in the system's directories (an absolute path kept as it is); config_invalid naming `why` when absent."""
    found = (
        name
        if os.path.isabs(name) and os.access(name, os.X_OK)
        else (None if os.path.isabs(name) else shutil.which(name, path=dirs))
    )
    if found is None:
        raise OpenAgentsError(ErrorType.CONFIG_INVALID, f"{why} needs the `{name}` command on the host (in {dirs})")
    return found


def environment(dirs: str = SYSTEM_DIRS, **extra: str) -> dict[str, str]:
    """A system program's environment: the system's PATH, the locale, and `extra`."""
    return {"PATH": dirs, **{k: os.environ[k] for k in KEPT if k in os.environ}, **extra}
