"""The rule set: first match wins, deny by default.

OA_EGRESS_RULES is a JSON list of {"name", "action": "allow"|"deny", "host", "port", "methods",
"path"}; host is exact, *.suffix or *, port null means 80/443, methods null means any, path null
means any (a glob on the path, query stripped). OA_EGRESS_ALLOW's hosts are appended as
whole-host allow rules. A passed-through CONNECT tunnel cannot be checked by method or path, so
it is allowed only when every request it could carry would be.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import json
import os
import re
import threading
from collections.abc import Iterable
from typing import Any

DEFAULT_PORTS = {80, 443}
TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")  # a header name (RFC 9110 token)
MAX_LIVE_FILE = 1 << 20


_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


def _canonical_escapes(glob: str) -> str:
    """A rule's path written with escapes, in the form request paths are compared in (checks.check_path):
    `%61` is `a`, other escapes upper case. A rule `/%61dmin*` then matches what `/admin/x` becomes."""
    return re.sub(
        r"%([0-9A-Fa-f]{2})",
        lambda m: chr(int(m.group(1), 16)) if chr(int(m.group(1), 16)) in _UNRESERVED else m.group().upper(),
        glob,
    )


class Rule:
    """One rule: host (exact, *.suffix, or * for any), port (None: 80 and 443), methods (None: any),
    path (None: any; else a glob on the path, query stripped), action allow or deny."""

    def __init__(
        self,
        host: str,
        port: int | None = None,
        methods: Iterable[str] | None = None,
        path: str | None = None,
        action: str = "allow",
        name: str = "",
        once: bool = False,
    ) -> None:
        self.host = host.strip().lower().rstrip(".")
        self.once = once  # a widened rule the person allowed for one request
        self.port = port
        self.methods = None if methods is None else frozenset(m.upper() for m in methods)
        self.path = None if path is None else _canonical_escapes(path)
        self.action = action
        self.name = name

    @classmethod
    def parse(cls, text: str, name: str = "") -> Rule:
        """A whole-host allow rule from OA_EGRESS_ALLOW's host[:port]."""
        host, _, port = text.strip().lower().rpartition(":") if text.count(":") == 1 else (text.strip().lower(), "", "")
        if not host:
            host, port = port, ""
        return cls(host, int(port) if port else None, name=name)

    @classmethod
    def from_dict(cls, data: dict[str, Any], name: str) -> Rule:
        action = data.get("action", "allow")
        if action not in ("allow", "deny"):
            raise ValueError(f"{name}: action must be allow or deny")
        port, methods, path = data.get("port"), data.get("methods"), data.get("path")
        if port is not None and (not isinstance(port, int) or isinstance(port, bool)):
            raise ValueError(f"{name}: port must be a number")
        if methods is not None and (not isinstance(methods, list) or not all(isinstance(m, str) for m in methods)):
            raise ValueError(f"{name}: methods must be a list of names")
        if path is not None and not isinstance(path, str):
            raise ValueError(f"{name}: path must be a glob")
        return cls(
            str(data["host"]), port, methods, path, action, str(data.get("name") or name), bool(data.get("once"))
        )

    @property
    def whole_host(self) -> bool:
        return self.methods is None and self.path is None

    def matches_host(self, host: str, port: int) -> bool:
        if self.port is not None and port != self.port:
            return False
        if self.port is None and port not in DEFAULT_PORTS:
            return False
        if self.host == "*":
            return True
        if self.host.startswith("*."):
            return host.endswith(self.host[1:]) and host != self.host[2:]
        return host == self.host

    def matches(self, host: str, port: int, method: str, path: str) -> bool:
        """`path` is the canonical one (checks.check_path). A deny rule's path matches in any case
        (servers differ on case: a deny fails closed), an allow rule's exactly as written."""
        if not (self.matches_host(host, port) and (self.methods is None or method in self.methods)):
            return False
        if self.path is None:
            return True
        if self.action == "deny":
            return fnmatch.fnmatchcase(path.lower(), self.path.lower())
        return fnmatch.fnmatchcase(path, self.path)

    def describe(self) -> str:
        methods = ",".join(sorted(self.methods)) if self.methods else "*"
        return (
            f"{self.name} ({self.action} {methods} "
            f"{self.host}{'' if self.port is None else f':{self.port}'}{self.path or ''})"
        )


class Policy:
    def __init__(
        self, allow: str, cidrs: str, rules: str = "", rule_set: str = "egress allow-list", live_file: str = ""
    ) -> None:
        self.rules = [Rule.from_dict(d, f"rules[{i}]") for i, d in enumerate(json.loads(rules or "[]"))]
        self.rules += [Rule.parse(r, f"allow[{i}]") for i, r in enumerate(r for r in allow.split(",") if r.strip())]
        self.cidrs = [ipaddress.ip_network(c.strip(), strict=False) for c in cidrs.split(",") if c.strip()]
        self.rule_set = rule_set
        # Rules the person widened this session (the host writes them with `docker exec`: the box
        # cannot reach this container's files). They come last, so they only decide what no
        # configured rule matched (a default deny): an explicit deny is never widened.
        self.live: list[Rule] = []
        self.live_file = live_file
        self._live_stamp: tuple[int, int, int] | None = None
        self._used_once: set[str] = set()
        self._live_lock = threading.Lock()

    def _refresh(self) -> list[Rule]:
        """The widened rules in force (a changed file is read again; a once-rule is gone after its use)."""
        if not self.live_file:
            return []
        with self._live_lock:
            try:
                st = os.stat(self.live_file)
                stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
                if stamp != self._live_stamp and st.st_size < MAX_LIVE_FILE:
                    with open(self.live_file) as f:
                        data = json.load(f)
                    self.live = [
                        Rule.from_dict({**d, "action": "allow", "name": f"widened[{d['id']}]"}, "") for d in data
                    ]
                    self._live_stamp = stamp
            except (OSError, ValueError, KeyError, TypeError):
                pass
            return [r for r in self.live if r.name not in self._used_once]

    def _use(self, rule: Rule) -> bool:
        """A once-rule decides one request only; False when another thread used it first."""
        if not rule.once:
            return True
        with self._live_lock:
            if rule.name in self._used_once:
                return False
            self._used_once.add(rule.name)
            return True

    def request(self, host: str, port: int, method: str, path: str) -> tuple[bool, str]:
        """First match wins; none matching is a refusal (deny by default). (allowed, the deciding rule)."""
        host = host.lower().rstrip(".")
        for rule in self.rules:
            if rule.matches(host, port, method, path):
                return rule.action == "allow", rule.describe()
        for rule in self._refresh():
            if rule.matches(host, port, method, path) and self._use(rule):
                return True, rule.describe()
        return False, "default deny"

    def tunnel(self, host: str, port: int) -> tuple[bool, str, str]:
        """A passed-through tunnel carries requests the gate never sees: it is allowed only when
        every request in it would be. (allowed, the deciding rule, why not)."""
        host = host.lower().rstrip(".")
        for rule in self.rules:
            if not rule.matches_host(host, port):
                continue
            if rule.whole_host:
                return (
                    rule.action == "allow",
                    rule.describe(),
                    "" if rule.action == "allow" else f"{host}:{port} is denied by {rule.describe()}",
                )
            if rule.action == "deny":
                return (
                    False,
                    rule.describe(),
                    (
                        f"{rule.describe()} limits methods or paths on {host}:{port}, which a passed-through "
                        "TLS tunnel cannot show; only hosts with a credential rule are opened and checked per request"
                    ),
                )
        for rule in self._refresh():
            if rule.whole_host and rule.matches_host(host, port) and self._use(rule):
                return True, rule.describe(), ""
        return (
            False,
            "default deny",
            f"{host}:{port} is not on the allow-list of {self.rule_set} "
            "(no rule allows the whole host; deny by default)",
        )

    def any_allow(self, host: str, port: int) -> str | None:
        """For an intercepted host: the first allow rule that could let some request through, else None."""
        host = host.lower().rstrip(".")
        return next(
            (
                r.describe()
                for r in [*self.rules, *self._refresh()]
                if r.action == "allow" and r.matches_host(host, port)
            ),
            None,
        )

    def address_allowed(self, ip: str) -> tuple[bool, str]:
        addr = ipaddress.ip_address(ip)
        if any(addr in net for net in self.cidrs):
            return True, "admin-allowed network"
        if not addr.is_global or addr.is_multicast:
            return False, f"{ip} is a private, loopback, link-local or reserved address"
        return True, "public address"

    def refusal(self, host: str, port: int, method: str, path: str, rule: str) -> str:
        """A refusal's words: the request (its path cut short), the rule set, the rule."""
        shown = path if len(path) <= 120 else f"{path[:120]}…[cut {len(path) - 120} chars]"
        if rule == "default deny":
            return (
                f"{method} {host}:{port}{shown} is not on the allow-list "
                f"of {self.rule_set} (no rule matches; deny by default)"
            )
        return f"{method} {host}:{port}{shown} is denied by {rule} of {self.rule_set}"


class Credential:
    """A header the gate puts into requests for one host (and path prefix): the value is put in that
    header only, never in a URL, a body, a log line or a refusal."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.host = str(data["host"]).lower().rstrip(".")
        self.port = int(data.get("port") or 443)
        self.path_prefix = str(data.get("path_prefix") or "/")
        self.header = str(data["header"])
        self.value = str(data["value"])
        self.secrets = [self.value] + [str(v) for v in data.get("secrets") or []]  # blanked in responses
        if not TOKEN.match(self.header) or any(c in self.value for c in "\r\n\0"):
            raise ValueError("a credential's header must be a header name and its value one line")

    def applies(self, host: str, port: int, path: str) -> bool:
        return host == self.host and port == self.port and path.startswith(self.path_prefix)
