"""The egress gate: a small HTTP forward and CONNECT proxy with rules by host, port, method and path.

Standard library only; runs in its own container (compose/proxy/Dockerfile; egress_proxy.py starts
it), the only door out of a sandbox's internal network. It refuses by default, refuses IP
literals, and refuses private, loopback and link-local destinations after resolving the name
itself (and then connects to the address it checked, so DNS rebinding cannot slip past), unless
an admin-level CIDR allows them. Every request, allowed or denied, is one JSON line on stdout
(audit.py), every field of it bounded.

What was checked is what is reached: a plain request's Host header must name the host and port
of its URL (one request per connection: nothing the client sends after it is forwarded, and a
request with two Content-Length headers is refused, so no second request rides along), a CONNECT's
Host header (if any) its target, and the TLS ClientHello sent through a CONNECT tunnel must name
the same server (SNI) or none; anything else is refused (domain fronting). A tunnel must carry TLS:
its first bytes must be a ClientHello (a plain protocol inside a tunnel would carry its own,
unchecked Host). What TLS then encrypts (the inner Host header, an ECH inner hello, which is
refused) cannot be seen without breaking TLS.

The jobs, one module each: rules.py (the rule set, first match wins, deny by default, and the
rules a person widened live), checks.py (what a request must look like: host names, paths,
bodies, ClientHellos; the one canonical path rules read and the upstream gets), tls.py (opening
the TLS of hosts with a credential rule), response.py (their answers read as the box's client will
read them: de-chunked, gzip decoded, re-framed; what cannot be read so is refused), redact.py (every
common form of a secret blanked in them), audit.py (the log, and the marks the host drains it by),
handler.py (one connection, start to end), settings.py (the environment read once).
"""
