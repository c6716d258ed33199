"""docs/security.md lists exactly the scenarios of tests/attacks, so it cannot go stale."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_security_table_lists_every_attack_scenario():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "security_report.py"), "--check"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr


def test_at_least_40_attack_scenarios():
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "tests/attacks"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert sum("::" in line for line in proc.stdout.splitlines()) >= 40
