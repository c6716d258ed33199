"""TLS for the hosts that have a credential rule: the gate ends the box's TLS with a certificate the
host signed for that host (OA_EGRESS_INTERCEPT: JSON {host: {"cert": PEM, "key": PEM}}; the CA's key
stays on the host) and re-originates TLS to the real host with full verification (system trust,
plus OA_EGRESS_UPSTREAM_CA's PEM). What comes back is read and blanked of the secret by response.py."""

from __future__ import annotations

import json
import os
import ssl
import tempfile
from collections.abc import Callable


def upstream_context(upstream_ca: str) -> ssl.SSLContext:
    """The verifying client context for re-originated TLS (HTTP/1.1 only: one checked request)."""
    context = ssl.create_default_context()
    if upstream_ca:
        context.load_verify_locations(cadata=upstream_ca)
    context.set_alpn_protocols(["http/1.1"])
    return context


def intercept_contexts(spec: str) -> dict[str, ssl.SSLContext]:
    """The per-host server contexts (each cert and key written to a private temp file, loaded,
    unlinked: nothing stays on disk)."""
    contexts: dict[str, ssl.SSLContext] = {}
    for host, pair in json.loads(spec or "{}").items():
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_alpn_protocols(["http/1.1"])  # no h2: one checked HTTP/1.1 request per connection
        fd, name = tempfile.mkstemp()
        try:
            with os.fdopen(fd, "w") as out:
                out.write(pair["cert"] + "\n" + pair["key"])
            ctx.load_cert_chain(name)
        finally:
            os.unlink(name)
        ctx.sni_callback = sni_check(host.lower())
        contexts[host.lower()] = ctx
    return contexts


SNI_ATTRIBUTE = "oa_sni"  # set on the box's SSLSocket: the server name its hello named (for the refusal's words)


def sni_check(expected: str) -> Callable[[ssl.SSLObject, str | None, ssl.SSLContext], int | None]:
    """The handshake goes on only for the host the CONNECT named (or no SNI): a mismatch is refused."""

    def check(sock: ssl.SSLObject, server_name: str | None, _ctx: ssl.SSLContext) -> int | None:
        setattr(sock, SNI_ATTRIBUTE, server_name)  # noqa: B010 (an attribute the class does not declare)
        if server_name is not None and server_name.lower().rstrip(".") != expected:
            return ssl.ALERT_DESCRIPTION_UNRECOGNIZED_NAME
        return None

    return check
