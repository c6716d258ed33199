#!/usr/bin/env python3
"""Regenerate the scenario table of docs/security.md from a real run of tests/attacks.

    .venv/bin/python scripts/security_report.py            # runs the battery, rewrites the table
    .venv/bin/python scripts/security_report.py --check    # fails if the table lists other scenarios than the tests

Each row is one scenario (a test, or one parameter of it), its one-line docstring, and the
outcome of this run under each runtime: the battery runs every box scenario under runc and under
runsc (gVisor), so `test_x[runc]` and `test_x[runsc]` are one row with two results.
tests/architecture/test_security_doc.py runs --check so the table cannot go stale.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "security.md"
ATTACKS = ROOT / "tests" / "attacks"
START, END = "<!-- attack-table:start -->", "<!-- attack-table:end -->"
RUNTIMES = ("runc", "runsc")


def split_runtime(name: str) -> tuple[str, str | None]:
    """`test_x[runsc-a/b]` -> (`test_x[a/b]`, `runsc`); `test_x[runc]` -> (`test_x`, `runc`)."""
    base, bracket, param = name.partition("[")
    if not bracket:
        return name, None
    param = param[:-1]
    for runtime in RUNTIMES:
        if param == runtime:
            return base, runtime
        if param.startswith(runtime + "-"):
            return f"{base}[{param[len(runtime) + 1 :]}]", runtime
    return name, None


def scenarios(ids: list[str]) -> list[str]:
    """The collected ids with the runtime parameter folded away, first-seen order, each once."""
    return list(dict.fromkeys(split_runtime(i)[0] for i in ids))


def docstrings() -> dict[str, str]:
    out = {}
    for path in sorted(ATTACKS.glob("test_*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                out[node.name] = (ast.get_docstring(node) or node.name).strip().replace("\n", " ")
    return out


def run_battery() -> dict[str, str]:
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "attacks.xml"
        subprocess.run([sys.executable, "-m", "pytest", "-q", str(ATTACKS), f"--junitxml={junit}"], cwd=ROOT)
        return read_junit(junit)


def read_junit(junit: Path) -> dict[str, str]:
    """Outcome per test name, from a JUnit XML report of a run that included tests/attacks."""
    results: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        if "attacks" not in (case.get("classname") or ""):
            continue
        outcome = "pass"
        skipped = case.find("skipped")
        if case.find("failure") is not None or case.find("error") is not None:
            outcome = "FAIL"
        elif skipped is not None:
            outcome = "skipped: " + (skipped.get("message") or "").replace("\n", " ")[:120]
        results[case.get("name", "")] = outcome
    return results


def outcome(results: dict[str, str], name: str) -> str:
    """One scenario's result: once for a host-only scenario, per runtime for a box scenario."""
    if name in results:
        return results[name]
    per_runtime = {
        split_runtime(n)[1]: r for n, r in results.items() if split_runtime(n)[0] == name and split_runtime(n)[1]
    }
    if not per_runtime:
        return "not run"
    return "<br>".join(f"{rt}: {per_runtime.get(rt, 'not run')}" for rt in RUNTIMES)


def table(ids: list[str], results: dict[str, str]) -> str:
    docs = docstrings()
    rows = ["| # | area | scenario | attack | result |", "|---|---|---|---|---|"]
    for n, test_id in enumerate(scenarios(ids), 1):
        module, name = test_id.split("::") if "::" in test_id else ("", test_id)
        base = name.split("[", 1)[0]
        param = name[len(base) :]
        area = Path(module).stem.removeprefix("test_").replace("_", " ") if module else ""
        attack = docs.get(base, base).replace("|", "\\|")
        rows.append(f"| {n} | {area} | `{base}{param.replace('|', '/')}` | {attack} | {outcome(results, name)} |")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true")
    parser.add_argument(
        "--junit",
        type=Path,
        help="take the outcomes from this JUnit report of a real run instead of running the battery",
    )
    args = parser.parse_args()
    text = DOC.read_text()
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    ids = collected_full()
    if args.check:
        listed = {
            line.split("`")[1] for line in rest.split(END, 1)[0].splitlines() if line.startswith("| ") and "`" in line
        }
        wanted = {i.split("::", 1)[1].replace("|", "/") for i in scenarios(ids)}
        if listed != wanted:
            print("docs/security.md is stale: run scripts/security_report.py", file=sys.stderr)
            print("missing:", sorted(wanted - listed)[:10], "extra:", sorted(listed - wanted)[:10], file=sys.stderr)
            return 1
        return 0
    results = read_junit(args.junit) if args.junit else run_battery()
    DOC.write_text(f"{head}{START}\n{table(ids, results)}\n{END}{tail}")
    passed = sum(v == "pass" for v in results.values())
    print(
        f"{passed} passed, {sum(v == 'FAIL' for v in results.values())} "
        f"failed, {len(results) - passed} not passing; table written to {DOC}"
    )
    return 0


def collected_full() -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", str(ATTACKS)], capture_output=True, text=True, cwd=ROOT
    )
    return [line.strip() for line in proc.stdout.splitlines() if "::" in line]


if __name__ == "__main__":
    sys.exit(main())
