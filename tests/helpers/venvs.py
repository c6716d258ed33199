"""Real virtualenvs for the host-code tests (issue 49): made with `python -m venv --without-pip` (fast:
no pip copied in), the project and its dependencies made importable the way an install does it.

- `venv(where, project=ROOT)`: the project found through a `.pth` line naming its checkout (what an
  editable install in compat mode writes), its dependencies through a second line naming this
  test run's own site-packages; `bin/oa-sandbox` is the console script pip writes.
- `editable_clone(ws_clone, venv)`: a clone of the project's packages (`clone`), found through a
  setuptools-style editable finder (`__editable___*_finder.py`, its MAPPING naming the clone's
  package directories, installed by a `.pth` line): the clone is not on sys.path at all.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEPENDENCIES = sysconfig.get_paths()["purelib"]  # this run's site-packages: pydantic, click, docker, ...
PY = f"python{sys.version_info.major}.{sys.version_info.minor}"

CONSOLE_SCRIPT = """#!{python}
# -*- coding: utf-8 -*-
import re
import sys
from orchestrator.cli import main
if __name__ == '__main__':
    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])
    sys.exit(main())
"""

FINDER = """import sys
from importlib.machinery import PathFinder

MAPPING: dict[str, str] = {mapping!r}


class _EditableFinder:  # MetaPathFinder, as setuptools' editable_wheel writes one
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname in MAPPING:
            parent = MAPPING[fullname].rsplit("/", 1)[0]
            return PathFinder.find_spec(fullname, path=[parent])
        return None


def install():
    if not any(finder is _EditableFinder for finder in sys.meta_path):
        sys.meta_path.append(_EditableFinder)
"""


def site_packages(venv: Path) -> Path:
    return venv / "lib" / PY / "site-packages"


def venv(where: Path, project: Path | None = ROOT) -> Path:
    """A virtualenv at `where`; returns its `bin/oa-sandbox`. `project`: the checkout a `.pth` names
    (None: none, the caller installs the project another way)."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, capture_output=True, timeout=120
    )
    lines = ([str(project)] if project is not None else []) + [DEPENDENCIES]
    (site_packages(where) / "oa_test_install.pth").write_text("\n".join(lines) + "\n")
    script = where / "bin" / "oa-sandbox"
    script.write_text(CONSOLE_SCRIPT.format(python=where / "bin" / "python3"))
    script.chmod(0o755)
    return script


def editable_clone(clone: Path, env: Path) -> None:
    """The project's packages copied to `clone` and installed editable into the venv `env`."""
    for name in ("orchestrator", "sandbox_agent"):
        shutil.copytree(ROOT / name, clone / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "Dockerfile.sandbox", clone / "Dockerfile.sandbox")
    shutil.copytree(
        ROOT / "compose" / "proxy", clone / "compose" / "proxy", ignore=shutil.ignore_patterns("__pycache__")
    )
    mapping = {name: str(clone / name) for name in ("orchestrator", "sandbox_agent")}
    sp = site_packages(env)
    (sp / "__editable___oa_clone_finder.py").write_text(FINDER.format(mapping=mapping))
    (sp / "__editable__.oa_clone.pth").write_text(
        "import __editable___oa_clone_finder; __editable___oa_clone_finder.install()\n"
    )
