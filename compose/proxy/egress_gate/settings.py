"""The gate's settings, read once from its container's environment (egress_proxy.py), or made by a
test or bench that runs the gate in-process.

Environment:
  OA_EGRESS_ALLOW        comma list of hosts: exact (pypi.org), suffix (*.pythonhosted.org), optional :port
  OA_EGRESS_ALLOW_CIDRS  comma list of CIDRs an admin allows (on-premises mirrors, test servers)
  OA_EGRESS_RULES, OA_EGRESS_RULE_SET, OA_EGRESS_LIVE_RULES  the rules (rules.py), the set's name,
                         the widened rules' file
  OA_EGRESS_CREDENTIALS  JSON list of {"host", "port", "path_prefix", "header", "value", "secrets"} (rules.Credential)
  OA_EGRESS_INTERCEPT, OA_EGRESS_UPSTREAM_CA  the opened hosts' certificates, extra upstream trust (tls.py)
  OA_EGRESS_PORT         listening port (3128)
  OA_EGRESS_MAX_REQUEST_BYTES / OA_EGRESS_MAX_RESPONSE_BYTES  caps (10 MiB / 256 MiB)
"""

from __future__ import annotations

import json
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field

from .audit import AuditLog
from .rules import Credential, Policy
from .tls import intercept_contexts, upstream_context

DEFAULT_MAX_REQUEST = 10 << 20
DEFAULT_MAX_RESPONSE = 256 << 20


@dataclass
class Settings:
    policy: Policy
    credentials: list[Credential] = field(default_factory=list)
    intercept: dict[str, ssl.SSLContext] = field(
        default_factory=dict
    )  # host -> server context with the host-signed certificate
    upstream_tls: ssl.SSLContext | None = None
    max_request: int = DEFAULT_MAX_REQUEST
    max_response: int = DEFAULT_MAX_RESPONSE
    audit: AuditLog = field(default_factory=AuditLog)

    @classmethod
    def from_environment(cls, env: Mapping[str, str] = os.environ) -> Settings:
        policy = Policy(
            env.get("OA_EGRESS_ALLOW", ""),
            env.get("OA_EGRESS_ALLOW_CIDRS", ""),
            env.get("OA_EGRESS_RULES", ""),
            env.get("OA_EGRESS_RULE_SET") or "egress allow-list",
            env.get("OA_EGRESS_LIVE_RULES", ""),
        )
        credentials = [Credential(d) for d in json.loads(env.get("OA_EGRESS_CREDENTIALS") or "[]")]
        return cls(
            policy,
            credentials,
            intercept_contexts(env.get("OA_EGRESS_INTERCEPT", "")),
            upstream_context(env.get("OA_EGRESS_UPSTREAM_CA", "")),
            int(env.get("OA_EGRESS_MAX_REQUEST_BYTES", DEFAULT_MAX_REQUEST)),
            int(env.get("OA_EGRESS_MAX_RESPONSE_BYTES", DEFAULT_MAX_RESPONSE)),
        )

    def intercepts(self, host: str, port: int) -> bool:
        """Whether the gate opens this target's TLS (a credential rule names it)."""
        return host in self.intercept and any(c.host == host and c.port == port for c in self.credentials)

    def credential_for(self, host: str, port: int, path: str) -> Credential | None:
        return next((c for c in self.credentials if c.applies(host, port, path)), None)

    def secrets_of(self, host: str) -> list[bytes]:
        return [s.encode("latin-1") for c in self.credentials if c.host == host for s in c.secrets]
