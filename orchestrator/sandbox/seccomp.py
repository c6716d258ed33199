"""The sandbox's seccomp profile: Docker's default, plus what a hostile box must never do to the host.

The box runs as the workspace owner (uid 0 for a root-owned workspace), so the kernel lets it
`chmod 4755` its own files, and those files land in the host's workspace: a setuid binary planted
for the host user. Capabilities do not stop an owner setting these bits; seccomp does. On top of
Docker's default profile (moby's `profiles/seccomp/default.json`, see `UPSTREAM`) the profile:

- refuses (EPERM) every mode change or file creation with S_ISUID or S_ISGID in the mode: the
  mode argument of chmod, fchmod, fchmodat, fchmodat2, open, openat, creat, mknod, mknodat,
  mkdir and mkdirat;
- refuses io_uring (its IORING_OP_OPENAT would create files where seccomp cannot see the mode),
  userfaultfd, bpf, perf_event_open and the kernel keyring (keyctl, add_key, request_key);
- answers openat2 ENOSYS: its mode lives in a struct seccomp cannot read, and ENOSYS makes libc
  fall back to openat, which it can.

Why the mode syscalls are *removed* from the default's allow list and added back only as
conditional allows: libseccomp (2.5.4, this machine's) drops an argument-conditional ERRNO rule
when the same syscall also has an unconditional ALLOW, whatever their order in the file (measured:
`chmod 4755` succeeded with both rules present). So a mode syscall is allowed only when
`mode & (S_ISUID|S_ISGID) == 0`, refused by one rule per bit, and refused by the default action
otherwise.

Docker 20.10 reads the profile with Go's encoding/json, which ignores fields it does not know: an
unknown field is a rule that silently vanishes. `validate` therefore accepts only the fields 20.10
understands (so upstream's `defaultErrnoRet` is dropped: 20.10 and runc give EPERM for a bare
SCMP_ACT_ERRNO anyway) and checks each of the guarantees above. runc likewise skips syscall names
its libseccomp does not know (fchmodat2 on libseccomp 2.5.4); such a syscall then gets runc's
ENOSYS stub or the default EPERM, never an allow.

Regenerate after updating the upstream copy:
    python -m orchestrator.sandbox.seccomp build default.json > orchestrator/sandbox/seccomp.json
"""

from __future__ import annotations

import copy
import functools
import json
import sys
from pathlib import Path
from typing import Any

from ..errors import ErrorType, OpenAgentsError

PROFILE_PATH = Path(__file__).with_name("seccomp.json")
UPSTREAM = "github.com/moby/moby@b985e2313a86 vendor/github.com/moby/profiles/seccomp/default.json"
DESCRIPTION = (
    "openagents profile (docker default + no setuid/setgid, no io_uring, "
    "userfaultfd, bpf, perf_event_open, keyrings; openat2 ENOSYS)"
)

S_ISUID = 0o4000
S_ISGID = 0o2000
EPERM = 1
ENOSYS = 38

# Index of the mode argument of each syscall that sets or creates a file mode (x86_64 and i386 agree).
MODE_ARGUMENT: dict[str, int] = {
    "chmod": 1,
    "fchmod": 1,
    "fchmodat": 2,
    "fchmodat2": 2,
    "open": 2,
    "openat": 3,
    "creat": 1,
    "mknod": 1,
    "mknodat": 2,
    "mkdir": 1,
    "mkdirat": 2,
}
REFUSED: tuple[str, ...] = (
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "userfaultfd",
    "bpf",
    "perf_event_open",
    "keyctl",
    "add_key",
    "request_key",
)
ANSWERED_ENOSYS: tuple[str, ...] = ("openat2",)

# The fields Docker 20.10's profiles/seccomp.Seccomp understands (anything else it silently ignores).
_TOP_FIELDS = {"defaultAction", "archMap", "syscalls"}
_ARCH_FIELDS = {"architecture", "subArchitectures"}
_RULE_FIELDS = {"names", "action", "errnoRet", "args", "comment", "includes", "excludes"}
_ARG_FIELDS = {"index", "value", "valueTwo", "op"}
_FILTER_FIELDS = {"caps", "arches", "minKernel"}
_ACTIONS = {"SCMP_ACT_ALLOW", "SCMP_ACT_ERRNO"}
_OPS = {"SCMP_CMP_NE", "SCMP_CMP_LT", "SCMP_CMP_LE", "SCMP_CMP_EQ", "SCMP_CMP_GE", "SCMP_CMP_GT", "SCMP_CMP_MASKED_EQ"}


def _masked(index: int, mask: int, expected: int) -> dict[str, Any]:
    return {"index": index, "value": mask, "valueTwo": expected, "op": "SCMP_CMP_MASKED_EQ"}


def build(upstream: dict[str, Any]) -> dict[str, Any]:
    """Docker's default profile with our rules: the refused and mode syscalls taken out of every
    allow rule (so no unconditional allow can shadow a conditional refusal), then added back."""
    profile = copy.deepcopy(upstream)
    profile.pop("defaultErrnoRet", None)
    taken = set(MODE_ARGUMENT) | set(REFUSED) | set(ANSWERED_ENOSYS)
    rules = []
    for rule in profile["syscalls"]:
        if rule["action"] == "SCMP_ACT_ALLOW":
            rule["names"] = [n for n in rule["names"] if n not in taken]
            if not rule["names"]:
                continue
        rules.append(rule)
    bits = S_ISUID | S_ISGID
    for index in sorted(set(MODE_ARGUMENT.values())):
        names = sorted(n for n, i in MODE_ARGUMENT.items() if i == index)
        rules.append(
            {
                "names": names,
                "action": "SCMP_ACT_ALLOW",
                "args": [_masked(index, bits, 0)],
                "comment": f"openagents: allowed only with no setuid/setgid bit in argument {index} (the mode)",
            }
        )
        for bit, label in ((S_ISUID, "S_ISUID"), (S_ISGID, "S_ISGID")):
            rules.append(
                {
                    "names": names,
                    "action": "SCMP_ACT_ERRNO",
                    "errnoRet": EPERM,
                    "args": [_masked(index, bit, bit)],
                    "comment": f"openagents: {label} in the mode (argument {index}) refused",
                }
            )
    rules.append(
        {
            "names": list(REFUSED),
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": EPERM,
            "comment": "openagents: io_uring (unfiltered file creation), "
            "userfaultfd, bpf, perf_event_open, keyrings refused",
        }
    )
    rules.append(
        {
            "names": list(ANSWERED_ENOSYS),
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": ENOSYS,
            "comment": "openagents: openat2's mode is in a struct seccomp cannot read; ENOSYS makes libc use openat",
        }
    )
    profile["syscalls"] = rules
    validate(profile)
    return profile


def _unknown(obj: dict[str, Any], allowed: set[str], where: str) -> None:
    extra = set(obj) - allowed
    if extra:
        raise ValueError(f"{where}: field(s) {sorted(extra)} that Docker 20.10 would silently ignore")


def validate(profile: dict[str, Any]) -> None:
    """Raise ValueError unless every guarantee in the module docstring holds for `profile`."""
    _unknown(profile, _TOP_FIELDS, "profile")
    if profile.get("defaultAction") != "SCMP_ACT_ERRNO":
        raise ValueError("defaultAction must be SCMP_ACT_ERRNO (allow by list)")
    for arch in profile.get("archMap", []):
        _unknown(arch, _ARCH_FIELDS, "archMap entry")
    allows: dict[str, list[dict[str, Any]]] = {}
    refusals: dict[str, list[dict[str, Any]]] = {}
    for n, rule in enumerate(profile["syscalls"]):
        where = f"syscalls[{n}]"
        _unknown(rule, _RULE_FIELDS, where)
        if rule["action"] not in _ACTIONS:
            raise ValueError(f"{where}: action {rule['action']} is not allow or errno")
        for key in ("includes", "excludes"):
            _unknown(rule.get(key) or {}, _FILTER_FIELDS, f"{where}.{key}")
        for arg in rule.get("args") or []:
            _unknown(arg, _ARG_FIELDS, f"{where}.args")
            if arg["op"] not in _OPS:
                raise ValueError(f"{where}: unknown comparison {arg['op']}")
        target = allows if rule["action"] == "SCMP_ACT_ALLOW" else refusals
        for name in rule["names"]:
            target.setdefault(name, []).append(rule)
    bits = S_ISUID | S_ISGID
    for name, index in MODE_ARGUMENT.items():
        for rule in allows.get(name, []):
            if rule.get("args") != [_masked(index, bits, 0)]:
                raise ValueError(f"{name} is allowed without the no-setuid/setgid condition on argument {index}")
        for bit in (S_ISUID, S_ISGID):
            if not any(
                r.get("args") == [_masked(index, bit, bit)] and r.get("errnoRet") == EPERM
                for r in refusals.get(name, [])
            ):
                raise ValueError(f"{name}: no EPERM rule for mode bit {bit:o} in argument {index}")
    for names, errno in ((REFUSED, EPERM), (ANSWERED_ENOSYS, ENOSYS)):
        for name in names:
            if name in allows:
                raise ValueError(f"{name} must not be allowed by any rule")
            if not any(not r.get("args") and r.get("errnoRet") == errno for r in refusals.get(name, [])):
                raise ValueError(f"{name}: no unconditional errno {errno} rule")


@functools.lru_cache(maxsize=1)
def profile_json() -> str:
    """The shipped profile, validated, as compact JSON text for `security_opt=["seccomp=<json>"]`."""
    try:
        profile = json.loads(PROFILE_PATH.read_text(encoding="utf-8"))
        validate(profile)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise OpenAgentsError(
            ErrorType.SANDBOX_START_FAILED,
            f"the seccomp profile {PROFILE_PATH} is missing or unsafe ({err}); reinstall openagents-sandbox",
        ) from None
    return json.dumps(profile, separators=(",", ":"), sort_keys=True)


def security_opt() -> str:
    return "seccomp=" + profile_json()


def _main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "build":
        print(
            "usage: python -m orchestrator.sandbox.seccomp build UPSTREAM_DEFAULT.json > seccomp.json", file=sys.stderr
        )
        return 2
    profile = build(json.loads(Path(argv[1]).read_text(encoding="utf-8")))
    print(json.dumps(profile, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
