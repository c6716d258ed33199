"""Issue 29 in real containers: a credential the gate injects and the box never holds, rules by
method and path, the audit record, under runc and runsc.

The "real" API is the compose testserver in TLS mode (`server.py tls`), started here on the
project's outer network (internal: nothing leaves it) as api.test:8443, with a certificate from its
own CA, which the gate is given (upstream_ca) the way a private CA would be. It records every
request it receives on stdout: what the API really got.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from orchestrator.config import DockerBackendConfig, EgressConfig, EgressCredential, EgressRule, SandboxConfig
from orchestrator.sandbox.docker import DockerSandbox
from tests.helpers import BOTH_RUNTIMES, make_workspace
from tests.helpers.egress import OUTER_CIDR, ROOT
from tests.helpers.egress_credentials import API, TOKEN, TOKEN_VAR

pytestmark = pytest.mark.docker


# The box's client: HTTPS through HTTPS_PROXY with urllib, trusting what SSL_CERT_FILE names;
# it sends a placeholder, which the gate replaces.
CLIENT = r"""
import json, os, sys, urllib.request, urllib.error
method, url = sys.argv[1], sys.argv[2]
data = sys.argv[3].encode() if len(sys.argv) > 3 else None
req = urllib.request.Request(url, data=data, method=method, headers={"Authorization": "Bearer placeholder"})
try:
    with urllib.request.urlopen(req, timeout=20) as r:
        print(json.dumps({"status": r.status, "body": r.read().decode(errors="replace")}))
except urllib.error.HTTPError as e:
    print(json.dumps({"status": e.code, "body": e.read().decode(errors="replace")}))
except Exception as e:
    print(json.dumps({"status": 0, "body": f"{type(e).__name__}: {e}"}))
"""

# The search of the box for anything shaped like a GitHub token (it is never told the token):
# every process's environ, cmdline and readable memory, and the files it can see.
SEARCH = r"""
import json, os, re, sys
SHAPE = re.compile(rb"ghp_[0-9a-f]{40}")
found, mem_bytes, pids = set(), 0, 0
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    pids += 1
    for name in ("environ", "cmdline"):
        try:
            found.update(SHAPE.findall(open(f"/proc/{pid}/{name}", "rb").read()))
        except OSError:
            pass
    try:
        maps = open(f"/proc/{pid}/maps").read().splitlines()
        mem = open(f"/proc/{pid}/mem", "rb", buffering=0)
    except OSError:
        continue
    with mem:
        for line in maps:
            addr, perms = line.split()[:2]
            if "r" not in perms:
                continue
            start, end = (int(x, 16) for x in addr.split("-"))
            if end - start > 256 << 20:
                continue
            try:
                mem.seek(start)
                chunk = mem.read(end - start)
            except (OSError, OverflowError, ValueError):
                continue
            mem_bytes += len(chunk)
            found.update(SHAPE.findall(chunk))
for top in ("/workspace", "/tmp", "/etc/openagents-egress"):
    for root, _, files in os.walk(top):
        for f in files:
            try:
                found.update(SHAPE.findall(open(os.path.join(root, f), "rb").read()))
            except OSError:
                pass
print(json.dumps({"found": sorted(x.decode() for x in found), "mem_bytes": mem_bytes, "pids": pids}))
"""


def received(api) -> list[dict]:
    """Every request the API has received, as it logged them."""
    return [
        json.loads(line)
        for line in api["container"].logs(stdout=True, stderr=False).splitlines()
        if line.startswith(b"{")
    ]


RULES = [
    EgressRule(action="deny", host="*", port=8443, methods=["DELETE"]),
    EgressRule(action="allow", host="api.test", port=8443, methods=["GET"], path="/repos/org/*"),
    EgressRule(action="allow", host="api.test", port=8443, methods=["POST"], path="/repos/org/issues"),
    EgressRule(action="allow", host="api.test", port=8443, methods=["GET"], path="/echo"),
    EgressRule(action="allow", host="api.test", port=8443, methods=["GET"], path="/redirect"),
]


@pytest.fixture
def api_box(request, egress_project, tls_api, docker_client, tmp_path, monkeypatch, runtime):
    monkeypatch.setenv(TOKEN_VAR, TOKEN)  # the host's environment: where the gate's credential comes from
    egress = EgressConfig(
        rules=RULES,
        credentials=[
            EgressCredential(host="api.test", port=8443, header="Authorization", value=f"Bearer ${{{TOKEN_VAR}}}")
        ],
        allow_cidrs=[OUTER_CIDR],
        outer_network=egress_project["outer"],
        upstream_ca=tls_api["ca_file"],
        rule_set="test API rules",
    )
    ws = make_workspace(tmp_path / "ws", {"client.py": CLIENT, "search.py": SEARCH})
    with DockerSandbox(
        ws, SandboxConfig(egress=egress, backend=DockerBackendConfig(runtime=runtime)), client=docker_client
    ) as box:
        yield box


def call(box, *args: str) -> tuple[dict, list[dict]]:
    result = box.call("shell", {"command": "python3 client.py " + " ".join(f"'{a}'" for a in args), "timeout": 60})
    return json.loads(result.output.strip().splitlines()[-1]), [r.model_dump() for r in result.egress]


@pytest.mark.parametrize("runtime", BOTH_RUNTIMES, indirect=True)
def test_the_api_gets_the_token_and_the_box_never_holds_it(api_box, tls_api):
    """An allowed GET: the API receives the real token, the box only the answer; the audit record is
    complete; a search of the box's /proc (environ, cmdline, memory) and files finds no token."""
    before = len(received(tls_api))
    reply, audit = call(api_box, "GET", f"{API}/repos/org/x?secret_query=1")
    assert reply["status"] == 200 and json.loads(reply["body"])["authorized"] is True, reply
    got = received(tls_api)[before:]
    assert [dict(r["headers"]).get("Authorization") for r in got] == [f"Bearer {TOKEN}"]
    (record,) = audit
    assert record["decision"] == "allow" and record["credential"] is True and record["tls"] == "intercepted"
    assert (record["method"], record["host"], record["port"], record["path"]) == (
        "GET",
        "api.test",
        8443,
        "/repos/org/x",
    )
    assert (
        record["bytes_up"] > 0
        and record["bytes_down"] > 0
        and "rules[1]" in record["rule"]
        and isinstance(record["time"], float)
    )
    env = api_box.call("shell", {"command": "env"}).output
    assert TOKEN_VAR not in env and TOKEN not in env  # no token, not even a placeholder: the gate sets the header
    assert "SSL_CERT_FILE=/etc/openagents-egress/bundle.pem" in env
    # An echoing endpoint: the API got the token, the box sees asterisks.
    reply, _ = call(api_box, "GET", f"{API}/echo")
    assert reply["status"] == 200 and TOKEN not in reply["body"] and "*" * len(TOKEN) in reply["body"]
    found = json.loads(
        api_box.call("shell", {"command": "python3 search.py", "timeout": 120}).output.strip().splitlines()[-1]
    )
    assert found["found"] == [] and found["pids"] >= 2
    assert found["mem_bytes"] > 1 << 20  # the memory of the box's processes was really read


@pytest.mark.parametrize("runtime", BOTH_RUNTIMES, indirect=True)
def test_rules_by_method_and_path_refuse_with_the_rule_set_named(api_box, tls_api):
    """DELETE and an unlisted path are refused (403 naming the rule set and the rule)
    and never reach the API; the placeholder in URL or body is never replaced."""
    before = len(received(tls_api))
    reply, audit = call(api_box, "DELETE", f"{API}/repos/org/x")
    body = json.loads(reply["body"])
    assert reply["status"] == 403 and body["rule_set"] == "test API rules" and "rules[0]" in body["rule"]
    assert audit[0]["decision"] == "deny" and audit[0]["credential"] is False and audit[0]["path"] == "/repos/org/x"
    reply, _ = call(api_box, "GET", f"{API}/admin")
    assert reply["status"] == 403 and json.loads(reply["body"])["rule"] == "default deny"
    reply, _ = call(api_box, "GET", f"{API}/repos/org/../../admin")
    assert reply["status"] in (400, 403)
    assert received(tls_api)[before:] == []
    reply, _ = call(api_box, "POST", f"{API}/repos/org/issues", "Bearer placeholder")
    assert reply["status"] == 200
    (got,) = received(tls_api)[before:]
    assert got["body"] == "Bearer placeholder" and TOKEN not in got["body"] + got["path"]


def test_a_missing_host_variable_is_a_typed_error(egress_project, docker_client, tmp_path, monkeypatch):
    """A credential naming a variable the host does not have: the
    session does not start (CONFIG_INVALID), nothing is left behind."""
    from orchestrator.errors import ErrorType, OpenAgentsError

    monkeypatch.delenv(TOKEN_VAR, raising=False)
    egress = EgressConfig(
        rules=RULES,
        credentials=[
            EgressCredential(host="api.test", port=8443, header="Authorization", value=f"Bearer ${{{TOKEN_VAR}}}")
        ],
        outer_network=egress_project["outer"],
    )
    with pytest.raises(OpenAgentsError) as err:
        with DockerSandbox(make_workspace(tmp_path / "ws"), SandboxConfig(egress=egress), client=docker_client):
            pass
    assert err.value.type == ErrorType.CONFIG_INVALID and TOKEN_VAR in str(err.value)


def test_the_audit_reaches_the_transcript_and_transcript_show(egress_project, tls_api, sandbox_image, tmp_path):
    """Through the CLI with an admin policy (network, upstream CA) and a user policy (rules, credential):
    every request is one transcript record with the audit fields, `transcript show` prints them, and
    neither the transcript nor the output holds the token."""
    ws = make_workspace(tmp_path / "ws", {"client.py": CLIENT})
    admin = tmp_path / "admin.toml"
    admin.write_text(
        f'[egress]\nallow_cidrs = ["{OUTER_CIDR}"]\nupstream_ca = "{tls_api["ca_file"]}"\n'
        '[[rules]]\ntool = "shell"\ndecision = "allow"\n'
    )
    user = tmp_path / "user.toml"
    user.write_text(
        '[[egress.rules]]\naction = "allow"\nhost = "api.test"\nport = 8443\nmethods = ["GET"]\npath = "/repos/org/*"\n'
        '[[egress.credentials]]\nhost = "api.test"\nport = 8443\nheader = "Authorization"\nvalue = "Bearer ${'
        + TOKEN_VAR
        + '}"\n'
    )
    script = tmp_path / "s.jsonl"
    script.write_text(
        "\n".join(
            json.dumps(t)
            for t in [
                {
                    "tool_calls": [
                        {"name": "shell", "arguments": {"command": f"python3 client.py GET {API}/repos/org/x?q=hidden"}}
                    ]
                },
                {
                    "tool_calls": [
                        {"name": "shell", "arguments": {"command": f"python3 client.py DELETE {API}/repos/org/x"}}
                    ]
                },
                {"text": "done"},
            ]
        )
    )
    transcript = tmp_path / "t.jsonl"
    env = {
        **os.environ,
        "OA_ADMIN_POLICY": str(admin),
        "OA_EGRESS_OUTER_NETWORK": egress_project["outer"],
        TOKEN_VAR: TOKEN,
        "PYTHONPATH": str(ROOT),
    }
    cli = [sys.executable, "-m", "orchestrator.cli"]
    proc = subprocess.run(
        [
            *cli,
            "run",
            "--workspace",
            str(ws),
            "--model",
            f"script:{script}",
            "--non-interactive",
            "--policy",
            str(user),
            "--transcript",
            str(transcript),
            "--output",
            "json",
            "call the API",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert TOKEN not in transcript.read_text() + proc.stdout + proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [
        (e["method"], e["host"], e["port"], e["path"], e["decision"], e["credential"]) for e in summary["egress"]
    ] == [
        ("GET", "api.test", 8443, "/repos/org/x", "allow", True),
        ("DELETE", "api.test", 8443, "/repos/org/x", "deny", False),
    ]
    assert summary["egress_omitted"] == 0 and summary["egress"][0]["bytes_down"] > 0
    events = [e for e in map(json.loads, transcript.read_text().splitlines()) if e["type"] == "egress"]
    assert [(e["method"], e["path"], e["decision"], e["credential"]) for e in events] == [
        ("GET", "/repos/org/x", "allow", True),
        ("DELETE", "/repos/org/x", "deny", False),
    ]
    assert all(e["bytes_up"] is not None and e["time"] and e["rule"] for e in events) and "hidden" not in json.dumps(
        events
    )
    shown = subprocess.run(
        [*cli, "transcript", "show", str(transcript)], capture_output=True, text=True, env=env, timeout=60, cwd=ROOT
    )
    assert (
        shown.returncode == 0 and "api.test:8443/repos/org/x" in shown.stdout and "credential injected" in shown.stdout
    )
    assert "default deny" in shown.stdout and TOKEN not in shown.stdout


# -- the hostile box, for real: raw bytes through the gate from inside the box ---------------------
ATTACK = r"""
import os, socket, ssl, sys
from urllib.parse import urlsplit
proxy = urlsplit(os.environ["HTTPS_PROXY"])
mode = sys.argv[1]
HEADS = {
    "cl_te": b"POST /repos/org/issues HTTP/1.1\r\nHost: api.test:8443\r\nContent-Length: 40\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /admin HTTP/1.1\r\nHost: api.test\r\n\r\n",
    "two_cl": b"POST /repos/org/issues HTTP/1.1\r\nHost: api.test:8443\r\nContent-Length: 0\r\nContent-Length: 38\r\n"
    b"\r\nGET /admin HTTP/1.1\r\nHost: api.test\r\n\r\n",
    "host": b"GET /repos/org/x HTTP/1.1\r\nHost: denied.test:8443\r\n\r\n",
    "h2": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    "huge": b"GET /repos/org/x HTTP/1.1\r\nHost: api.test:8443\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n",
    "redirect": b"GET /redirect HTTP/1.1\r\nHost: api.test:8443\r\n\r\n",
}
sock = socket.create_connection((proxy.hostname, proxy.port), timeout=20)
target = "denied.test:8443" if mode == "follow" else "api.test:8443"
sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
head = b""
while b"\r\n\r\n" not in head:
    chunk = sock.recv(1)
    if not chunk:
        break
    head += chunk
print("CONNECT", head.split(b"\r\n")[0].decode())
if not head.startswith(b"HTTP/1.1 200"):
    sys.exit()
ctx = ssl.create_default_context()  # SSL_CERT_FILE: the session CA is trusted
ctx.set_alpn_protocols(["h2", "http/1.1"])
try:
    tls = ctx.wrap_socket(sock, server_hostname="denied.test" if mode == "sni" else "api.test")
except (ssl.SSLError, OSError) as e:
    print("HANDSHAKE", type(e).__name__)
    sys.exit()
print("ALPN", tls.selected_alpn_protocol())
tls.sendall(HEADS[mode])
out = b""
try:
    while chunk := tls.recv(65536):
        out += chunk
except (OSError, ssl.SSLError):
    pass
print("REPLY", out.split(b"\r\n")[0].decode(errors="replace"), b"Location: https://denied.test:8443/steal" in out)
"""


@pytest.mark.parametrize("runtime", BOTH_RUNTIMES, indirect=True)
def test_hostile_requests_from_the_box_get_nothing_through(api_box, tls_api):
    """From inside the box, through the real gate: CL+TE, two Content-Lengths, an inner Host naming
    another server, an h2 preface, a 70 KB header, an SNI naming another server, and following a
    redirect to another host: none reaches the API (or that host); h2 is never negotiated."""
    assert api_box.call("write_file", {"path": "attack.py", "content": ATTACK}).ok
    before = len(received(tls_api))

    def attack(mode: str) -> list[str]:
        return (
            api_box.call("shell", {"command": f"python3 attack.py {mode}", "timeout": 60}).output.strip().splitlines()
        )

    for mode, status in (
        ("cl_te", ("400", "411")),
        ("two_cl", ("400",)),
        ("host", ("403",)),
        ("h2", ("400",)),
        ("huge", ("431",)),
    ):
        out = attack(mode)
        assert out[:2] == ["CONNECT HTTP/1.1 200 Connection Established", "ALPN http/1.1"], (mode, out)
        assert out[2].split()[2] in status, (mode, out)
    assert attack("sni")[1] == "HANDSHAKE SSLError"
    assert received(tls_api)[before:] == []
    redirect = attack("redirect")
    assert redirect[2].startswith("REPLY HTTP/1.1 302") and redirect[2].endswith("True")  # relayed, not followed
    follow = attack("follow")
    assert follow == ["CONNECT HTTP/1.1 403 Egress Refused"]
    assert [r["path"] for r in received(tls_api)[before:]] == ["/redirect"]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            '[[egress.credentials]]\nhost = "api.test"\nheader = "Authorization"\nvalue = "Bearer ghp_literal"\n',
            "must name a host variable",
        ),
        ('[[egress.credentials]]\nhost = "*.test"\nheader = "Authorization"\nvalue = "Bearer ${X}"\n', "exact host"),
        (
            '[[egress.credentials]]\nhost = "api.test"\nheader = "Host"\nvalue = "${X}"\n',
            "header name the gate may set",
        ),
        ('[[egress.rules]]\naction = "allow"\nhost = "api.test"\npaht = "/x"\n', "did you mean 'path'"),
        ('[egress]\nupstream_ca = "/etc/ca.pem"\n', "admin-only"),
    ],
)
def test_bad_egress_policy_is_a_typed_error_that_never_quotes_the_value(tmp_path, text, problem):
    """A literal token, a wildcard credential host, a header the gate must own, a
    misspelt key, a user-tier upstream_ca: CONFIG_INVALID, the value never echoed."""
    from orchestrator.errors import ErrorType, OpenAgentsError
    from orchestrator.policy.ladder import load_policy_file

    policy = tmp_path / "p.toml"
    policy.write_text(text)
    with pytest.raises(OpenAgentsError) as err:
        load_policy_file(str(policy))
    assert (
        err.value.type == ErrorType.CONFIG_INVALID and problem in str(err.value) and "ghp_literal" not in str(err.value)
    )
