"""Issue 40 class 2 in real containers: what the box's HTTP client decodes holds no token.

The compose testserver in TLS mode as api.test (tests/egress/test_egress_credentials.py's tls_api)
echoes the request's headers, with the token the gate injected, chunked in 16-byte chunks, gzipped
although the gate asked for identity, or base64. The box's client (Python's http.client through
urllib, which de-chunks; it gunzips and base64-decodes what it gets as a curious client would)
pads its own header 0..15 bytes so that a chunk boundary lands at every place in the token, and
looks for the token in what it decoded.
"""

from __future__ import annotations

import json

import pytest

from orchestrator.config import DockerBackendConfig, EgressConfig, EgressCredential, EgressRule, SandboxConfig
from orchestrator.sandbox.docker import DockerSandbox
from tests.helpers import BOTH_RUNTIMES, make_workspace
from tests.helpers.egress import OUTER_CIDR
from tests.helpers.egress_credentials import API, TOKEN, TOKEN_VAR

pytestmark = [pytest.mark.docker, pytest.mark.slow]  # about 45 s per runtime

# Each kind, each padding: one request; prints what the client made of the answers.
DECODING_CLIENT = r"""
import base64, binascii, gzip, json, re, sys, urllib.request, urllib.error
url, kinds = sys.argv[1], sys.argv[2].split(",")
shape = re.compile(rb"ghp_[0-9a-f]{40}")
out = []
for kind in kinds:
    for pad in range(16):
        req = urllib.request.Request(f"{url}/echo/{kind}", headers={"X-Pad": "p" * pad, "Accept-Encoding": "gzip"})
        try:
            with urllib.request.urlopen(req, timeout=20) as r:
                status, coding, body = r.status, r.headers.get("Content-Encoding"), r.read()
        except urllib.error.HTTPError as e:
            status, coding, body = e.code, None, e.read()
        forms = [body]
        if coding == "gzip":
            forms.append(gzip.decompress(body))
        clean = re.sub(rb"[^A-Za-z0-9+/]", b"", body)
        try:
            forms.append(base64.b64decode(clean[: len(clean) // 4 * 4]))
        except (binascii.Error, ValueError):
            pass
        found = sorted({m.decode() for f in forms for m in shape.findall(f)})
        out.append({"kind": kind, "pad": pad, "status": status, "found": found,
                    "echoed": b"Authorization" in b"".join(forms)})
print(json.dumps(out))
"""


@pytest.mark.parametrize("runtime", BOTH_RUNTIMES, indirect=True)
def test_a_chunked_gzipped_or_base64_echo_never_decodes_to_the_token(
    egress_project,
    tls_api,  # noqa: F811 (the fixture, imported above)
    docker_client,
    tmp_path,
    monkeypatch,
    runtime,
):
    monkeypatch.setenv(TOKEN_VAR, TOKEN)
    egress = EgressConfig(
        rules=[EgressRule(action="allow", host="api.test", port=8443, methods=["GET"], path="/echo/*")],
        credentials=[
            EgressCredential(host="api.test", port=8443, header="Authorization", value=f"Bearer ${{{TOKEN_VAR}}}")
        ],
        allow_cidrs=[OUTER_CIDR],
        outer_network=egress_project["outer"],
        upstream_ca=tls_api["ca_file"],
    )
    ws = make_workspace(tmp_path / "ws", {"client.py": DECODING_CLIENT})
    with DockerSandbox(
        ws, SandboxConfig(egress=egress, backend=DockerBackendConfig(runtime=runtime)), client=docker_client
    ) as box:
        result = box.call("shell", {"command": f"python3 client.py {API} chunked,gzip,b64", "timeout": 240})
    answers = json.loads(result.output.strip().splitlines()[-1])
    assert len(answers) == 48 and all(a["status"] == 200 and a["echoed"] for a in answers), answers[:3]
    assert [a for a in answers if a["found"]] == []
