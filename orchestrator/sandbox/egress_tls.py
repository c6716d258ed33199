"""The per-session CA behind credential injection (sandbox/egress.py, compose/proxy/egress_gate/).

Made on the host with the `openssl` CLI (the `cryptography` package is no dependency of ours): a CA
valid for two days, and one leaf certificate per host that has a credential rule. The CA's private
key is deleted as soon as the leaves are signed, so nothing can sign another certificate with it;
it never leaves the host and never reaches the gate or the box. The gate gets only the leaves
(certificate and key, for the hosts it opens); the box gets only the CA certificate, trusted
through SSL_CERT_FILE, REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE, NODE_EXTRA_CA_CERTS and OpenSSL's
system paths (a bundle of certifi's Mozilla roots plus this CA, mounted read-only).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import certifi
from docker.types import Mount

from ..errors import ErrorType, OpenAgentsError
from ..programs import system
from .mounts import read_only

BOX_DIR = "/etc/openagents-egress"
BOX_CA = f"{BOX_DIR}/ca.pem"
BOX_BUNDLE = f"{BOX_DIR}/bundle.pem"
# OpenSSL's default CA file in Debian's build, and Debian's bundle path that curl, git and others read.
SYSTEM_BUNDLES = ("/usr/lib/ssl/cert.pem", "/etc/ssl/certs/ca-certificates.crt")
OPENSSL_TIMEOUT_S = 30


# Where `openssl` is looked for: the system's own directories, never the user's PATH, which may name a
# directory the box writes (an activated virtualenv in the workspace, direnv's PATH_add): a program
# planted there would run on the host at the next session with a credential rule (issue 49). It runs
# with the system's environment (programs/system.py): an OPENSSL_CONF of the user's naming a file in
# the workspace (a direnv .envrc exports it) would load the provider module the box wrote.
OPENSSL_DIRS = "/usr/local/bin:/usr/bin:/bin"


def openssl_program() -> str:
    return system.find("openssl", "credential injection", OPENSSL_DIRS)


def _openssl(*args: str, cwd: Path) -> None:
    try:
        subprocess.run(
            [openssl_program(), *args],
            cwd=cwd,
            check=True,
            capture_output=True,
            timeout=OPENSSL_TIMEOUT_S,
            env=system.environment(OPENSSL_DIRS),
        )
    except FileNotFoundError:
        raise OpenAgentsError(
            ErrorType.CONFIG_INVALID, "credential injection needs the `openssl` command on the host"
        ) from None
    except subprocess.SubprocessError as err:
        detail = getattr(err, "stderr", b"") or b""
        raise OpenAgentsError(
            ErrorType.SANDBOX_START_FAILED, f"could not make the session CA: {detail.decode(errors='replace')[-300:]}"
        ) from None


class SessionCA:
    """A CA for one session, its leaves, and the files the box trusts; close() removes them."""

    def __init__(self, hosts: list[str]) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="oa-egress-ca-"))
        try:
            self._make(sorted(set(hosts)))
        except BaseException:
            self.close()
            raise

    def _make(self, hosts: list[str]) -> None:
        work = self.dir / "work"
        work.mkdir(mode=0o700)
        curve = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
        _openssl(
            "req",
            "-x509",
            *curve,
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            f"/CN=openagents-sandbox egress session CA {uuid.uuid4().hex[:12]}",
            "-addext",
            "basicConstraints=critical,CA:TRUE,pathlen:0",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            cwd=work,
        )
        self.leaves: dict[str, dict[str, str]] = {}
        for i, host in enumerate(hosts):
            (work / f"{i}.ext").write_text(
                f"subjectAltName=DNS:{host}\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                "extendedKeyUsage=serverAuth\nsubjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n"
            )
            _openssl("req", "-new", *curve, "-keyout", f"{i}.key", "-out", f"{i}.csr", "-subj", f"/CN={host}", cwd=work)
            _openssl(
                "x509",
                "-req",
                "-in",
                f"{i}.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-set_serial",
                str(int(uuid.uuid4().int >> 66)),
                "-days",
                "2",
                "-extfile",
                f"{i}.ext",
                "-out",
                f"{i}.pem",
                cwd=work,
            )
            self.leaves[host] = {"cert": (work / f"{i}.pem").read_text(), "key": (work / f"{i}.key").read_text()}
        self.ca_pem = (work / "ca.pem").read_text()
        shutil.rmtree(work)  # the CA key and the leaf keys: the gate has the leaves in memory (its environment)
        trust = self.dir / "trust"
        trust.mkdir()
        (trust / "ca.pem").write_text(self.ca_pem)
        (trust / "bundle.pem").write_text(Path(certifi.where()).read_text() + "\n" + self.ca_pem)
        for path in (trust / "ca.pem", trust / "bundle.pem"):
            os.chmod(path, 0o644)
        os.chmod(trust, 0o755)
        self.trust = trust

    def box_mounts(self) -> list[Mount]:
        return [
            read_only(self.trust, BOX_DIR),
            *(read_only(self.trust / "bundle.pem", target) for target in SYSTEM_BUNDLES),
        ]

    @staticmethod
    def box_environment() -> dict[str, str]:
        return {
            "SSL_CERT_FILE": BOX_BUNDLE,
            "REQUESTS_CA_BUNDLE": BOX_BUNDLE,
            "CURL_CA_BUNDLE": BOX_BUNDLE,
            "GIT_SSL_CAINFO": BOX_BUNDLE,
            "NODE_EXTRA_CA_CERTS": BOX_CA,
        }

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
