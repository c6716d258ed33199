"""The tests of tests/unit/test_backend_config.py that need a real box (issue 48: one tier per folder);
what they are about is said there."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import make_workspace
from tests.helpers.backend_config import TAG
from tests.helpers.cli_run import oa

ROOT = Path(__file__).resolve().parents[2]


THIS_CHECKOUT = {"PYTHONPATH": str(ROOT)}  # the installed oa-sandbox may be another checkout's (an editable install)


@pytest.mark.docker
def test_doctor_reads_image_and_runtime_from_the_flags_and_the_config_file(tmp_path: Path):
    """Through the real CLI against the real daemon: the image it checks and the runtime it reports
    are the ones the flags, else config.toml, name."""
    ws = make_workspace(tmp_path / "ws")
    proc = oa(tmp_path, "doctor", "--workspace", str(ws), "--image", TAG, "--runtime", "runc", env=THIS_CHECKOUT)
    assert (
        f"image {TAG}: missing" in proc.stdout and "runtime runc: runc: asked for with --runtime runc" in proc.stdout
    ), proc.stdout + proc.stderr
    config = tmp_path / "config" / "openagents-sandbox" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(f'image = "{TAG}-file"\nruntime = "runc"\n')
    proc = oa(tmp_path, "doctor", "--workspace", str(ws), env=THIS_CHECKOUT)
    assert f"image {TAG}-file: missing" in proc.stdout and "runtime runc: runc: asked for" in proc.stdout, (
        proc.stdout + proc.stderr
    )
    config.write_text('runtime = "oa-no-such-runtime"\n')
    proc = oa(tmp_path, "doctor", "--workspace", str(ws), env=THIS_CHECKOUT)
    assert proc.returncode == 2 and "config_invalid: --runtime oa-no-such-runtime" in proc.stderr, proc.stderr
