"""Sandbox settings (pydantic). Defaults are the hardened ones; every knob only tightens or sizes."""

from __future__ import annotations

import os
import re
from typing import Annotated, Any, Literal, Mapping, Self, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# OA_SANDBOX_IMAGE: another tag for the sandbox image, so that two checkouts with different agents
# (a branch under test beside main) do not rebuild one shared tag under each other.
DEFAULT_IMAGE = os.environ.get("OA_SANDBOX_IMAGE") or "openagents-sandbox:latest"
# OA_EGRESS_PROXY_IMAGE: the same for the proxy's image, which carries the agent's hash too (image.py):
# without it a branch's changed agent makes the shared proxy tag stale for everyone.
EGRESS_PROXY_IMAGE = os.environ.get("OA_EGRESS_PROXY_IMAGE") or "openagents-egress-proxy:latest"
EGRESS_PROXY_ALIAS = "egress-proxy"
EGRESS_PROXY_PORT = 3128
LABEL = "dev.openagents.sandbox"
# Every front-end's default turn limit (run, acp, batch, a config file without max_turns).
DEFAULT_MAX_TURNS = 100

# The only host variables that may reach the container, with fixed values, never copied from the host.
BASE_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "LANG": "C.UTF-8",
    "TERM": "dumb",
}
# OA_START_CONCURRENCY: how many sandbox starts one host process runs at once (sandbox/starts.py).
# Four keep a 2-core machine busy without making every start wait behind a hundred others.
DEFAULT_START_CONCURRENCY = 4
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


_HOST_PATTERN = re.compile(r"^(\*|(\*\.)?[a-z0-9_]([a-z0-9_.-]{0,251}[a-z0-9_])?)$")
_HEADER = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}$")
_TEMPLATE_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]{0,127})\}")


class EgressRule(BaseModel):
    """One egress rule ([[egress.rules]]): first match wins, and no match is a refusal."""

    model_config = ConfigDict(extra="forbid")
    action: Literal["allow", "deny"]
    host: str = Field(description="Exact, *.suffix, or * for any host.")
    port: int | None = Field(default=None, ge=1, le=65535, description="None: 80 and 443.")
    methods: list[str] | None = Field(default=None, description="None: any method.")
    path: str | None = Field(
        default=None,
        description="A glob on the request path (query stripped); None: any path. "
        "Checked only where the gate sees requests: plain http and hosts with a credential rule.",
    )

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        value = value.lower().rstrip(".")
        if not _HOST_PATTERN.match(value):
            raise ValueError(f"not a host pattern: {value!r}")
        return value

    @field_validator("methods")
    @classmethod
    def _methods(cls, value: list[str] | None) -> list[str] | None:
        if value is None or value == ["*"]:
            return None
        if not value or not all(_HEADER.match(m) for m in value):
            raise ValueError('methods: a list of HTTP method names, or ["*"]')
        return [m.upper() for m in value]

    @field_validator("path")
    @classmethod
    def _path(cls, value: str | None) -> str | None:
        if value is None or value in ("*", "/*"):
            return None
        if not value.startswith("/") or len(value) > 1024 or any(ord(c) < 0x21 or ord(c) > 0x7E for c in value):
            raise ValueError("path: a glob starting with / (visible ASCII)")
        return value


class EgressCredential(BaseModel):
    """A credential the gate adds to requests for one host ([[egress.credentials]]); the box never holds it."""

    model_config = ConfigDict(extra="forbid")
    host: str = Field(description="The exact host (no wildcard): the gate opens TLS for this host only.")
    port: int = Field(default=443, ge=1, le=65535)
    path_prefix: str = Field(default="/", description="Only requests whose path starts with this get the credential.")
    header: str = Field(description="The header the gate sets (any value the box sent in it is replaced).")
    value: str = Field(description="A template naming host variables, e.g. 'Bearer ${GITHUB_TOKEN}'.")

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        value = value.lower().rstrip(".")
        if "*" in value or not _HOST_PATTERN.match(value):
            raise ValueError(f"not an exact host: {value!r}")
        return value

    @field_validator("header")
    @classmethod
    def _header(cls, value: str) -> str:
        if not _HEADER.match(value) or value.lower() in ("host", "content-length", "transfer-encoding", "connection"):
            raise ValueError(f"not a header the gate may set: {value!r}")
        return value

    @field_validator("path_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        if not value.startswith("/") or any(ord(c) < 0x21 or ord(c) > 0x7E for c in value):
            raise ValueError("path_prefix must start with / (visible ASCII)")
        return value

    @field_validator("value")
    @classmethod
    def _template(cls, value: str) -> str:
        if not _TEMPLATE_VAR.search(value) or any(c in value for c in "\r\n\0"):
            raise ValueError("value must name a host variable, e.g. 'Bearer ${GITHUB_TOKEN}', on one line")
        return value

    @property
    def variables(self) -> list[str]:
        return _TEMPLATE_VAR.findall(self.value)

    def resolve(self, environ: dict[str, str] | os._Environ[str] = os.environ) -> str:
        """The header's value from the host's environment (here only: never in the box's)."""
        missing = [name for name in self.variables if not environ.get(name)]
        if missing:
            raise ValueError(f"the credential for {self.host} needs {', '.join(missing)} set in the host's environment")
        value = _TEMPLATE_VAR.sub(lambda m: environ[m.group(1)], self.value)
        if any(c in value for c in "\r\n\0"):
            raise ValueError(f"the credential for {self.host} would not fit on one header line")
        return value


class EgressConfig(BaseModel):
    """Opt-in egress through the allow-listing proxy (see sandbox/egress.py)."""

    model_config = ConfigDict(extra="forbid")
    allow: list[str] = Field(default_factory=list, description="Hosts: exact, *.suffix, optional :port.")
    rules: list[EgressRule] = Field(
        default_factory=list, description="Rules by host, port, method and path; before `allow`'s hosts."
    )
    credentials: list[EgressCredential] = Field(
        default_factory=list, description="Credentials the gate injects (user or admin policy only)."
    )
    rule_set: str = Field(default="session egress rules", max_length=120, description="The name refusals quote.")
    upstream_ca: str | None = Field(
        default=None, description="A PEM file the gate also trusts for re-originated TLS (private CAs, tests)."
    )
    allow_cidrs: list[str] = Field(
        default_factory=list, description="Admin-level only: private networks the proxy may reach."
    )
    network: str | None = Field(
        default=None,
        description="Join this existing internal network (a shared gate, e.g. compose/) instead of starting one.",
    )
    outer_network: str = Field(
        default_factory=lambda: os.environ.get("OA_EGRESS_OUTER_NETWORK", "bridge"),
        description="The network the proxy reaches the world through (OA_EGRESS_OUTER_NETWORK).",
    )
    proxy_image: str = EGRESS_PROXY_IMAGE

    @field_validator("allow")
    @classmethod
    def _hosts(cls, value: list[str]) -> list[str]:
        for host in value:
            if not host or any(c in host for c in " ,/@") or host.count(":") > 1:
                raise ValueError(f"not a host: {host!r}")
        return value

    @property
    def proxy_url(self) -> str:
        return f"http://{EGRESS_PROXY_ALIAS}:{EGRESS_PROXY_PORT}"

    def environment(self) -> dict[str, str]:
        """The proxy variables only. A credential's variables are not set in the box, not even to a
        placeholder (the shell drops secret-looking names anyway): the gate sets the header whether
        or not the box sent one, and replaces whatever it sent."""
        url = self.proxy_url
        return {
            "HTTP_PROXY": url,
            "HTTPS_PROXY": url,
            "http_proxy": url,
            "https_proxy": url,
            "NO_PROXY": "",
            "no_proxy": "",
        }


class SandboxLimits(BaseModel):
    """What every backend enforces, whatever runs the box: sizes, deadlines, user, environment, egress."""

    model_config = ConfigDict(extra="forbid")

    memory: str = Field(default="1g", description="Memory limit, swap included (docker's mem_limit syntax).")
    pids: int = Field(default=256, ge=16, le=65536)
    cpus: float = Field(default=1.0, gt=0, le=64)
    tmp_size: str = Field(default="256m", description="Size of the tmpfs at /tmp.")
    max_file_size: int = Field(default=1 << 30, ge=1 << 20, description="RLIMIT_FSIZE for everything in the box.")
    env: dict[str, str] = Field(default_factory=dict, description="Explicit, user-approved extra variables.")
    user: str | None = Field(default=None, description="uid:gid; default: the workspace owner's.")
    egress: EgressConfig | None = Field(
        default=None, description="Opt-in egress through the allow-listing proxy; default: no network."
    )
    write_quota: int = Field(
        default=4 << 30, ge=1 << 20, description="Bytes the session may grow the workspace by (--write-quota)."
    )
    entry_quota: int = Field(
        default=200_000,
        ge=100,
        description="New entries (files, directories, links: inodes) the session may "
        "create in the workspace (--entry-quota).",
    )
    workspace_read_only: bool = Field(
        default=False, description="The workspace is mounted read-only (a policy's workspace_access = read-only)."
    )
    host_code_read_only: bool = Field(
        default=False,
        description="Bind mode on a workspace that holds what the host itself runs or imports "
        "(its virtualenv, an editable clone, its config): those entries are mounted "
        "read-only in the box (--host-code-read-only). Without it such a workspace is "
        "worked on as a copy (auto) and bind mode is refused (workspace/host_code.py).",
    )
    read_only_entries: list[str] = Field(
        default_factory=list,
        description="Top-level workspace entries the box gets read-only: the host's "
        "own code, under host_code_read_only (set by the session).",
    )
    call_deadline_s: float = Field(default=120.0, gt=0, description="Host deadline for a non-shell call.")
    shell_grace_s: float = Field(default=5.0, gt=0, le=60)
    start_concurrency: int = Field(
        default_factory=lambda: os.environ.get("OA_START_CONCURRENCY") or DEFAULT_START_CONCURRENCY,
        ge=1,
        le=256,
        validate_default=True,
        description="Sandbox starts one host process runs at once; the rest wait in line (--start-concurrency, "
        "OA_START_CONCURRENCY).",
    )

    @field_validator("read_only_entries")
    @classmethod
    def _entry_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if name in ("", ".", "..") or "/" in name or "\0" in name or len(os.fsencode(name)) > 255:
                raise ValueError(f"not the name of an entry at the workspace's top: {name!r}")
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not _ENV_NAME.match(name):
                raise ValueError(f"not a variable name: {name!r}")
        return value

    def environment(self) -> dict[str, str]:
        return {**BASE_ENV, **self.env}


class DockerBackendConfig(BaseModel):
    """What only the Docker backend reads: the image tag and the OCI runtime."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["docker"] = "docker"  # the discriminator: which backend this config is for
    image: str = DEFAULT_IMAGE
    runtime: str | None = Field(default=None, description="Docker runtime, e.g. runsc for gVisor.")
    engine: Literal["docker", "podman"] | None = Field(
        default=None,
        description="Who runs the boxes: the Docker daemon, or Podman through its Docker-compatible service "
        "(sandbox/podman.py). Default: OA_ENGINE, else Docker when a daemon answers, else Podman when installed.",
    )


# One config class per backend, told apart by `kind` (as SWE-ReX's deployment configs by `type`);
# sandbox/backend.py's backend_from_config() is the one place that makes a backend from one.
BackendConfig = Annotated[Union[DockerBackendConfig], Field(discriminator="kind")]
# The Docker config's keys as the CLI (--image, --runtime, --engine), config.toml and older callers say them: flat.
_FLAT_KEYS = frozenset({"image", "runtime", "engine"})


class SandboxConfig(SandboxLimits):
    """A session's sandbox: the limits every backend enforces, and the backend's own config.

    The flat spellings stay what the CLI and config.toml take: `backend="docker"` names the kind,
    and `image=`/`runtime=` go into the Docker config (so `SandboxConfig(runtime="runsc")` is
    `SandboxConfig(backend=DockerBackendConfig(runtime="runsc"))`)."""

    model_config = ConfigDict(extra="forbid")

    backend: BackendConfig = Field(
        default_factory=DockerBackendConfig, description="Which backend starts the box, and its own settings."
    )

    @model_validator(mode="before")
    @classmethod
    def _flat_keys(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not ({"backend", *_FLAT_KEYS} & data.keys()):
            return data
        data = dict(data)
        backend = data.pop("backend", None)
        if isinstance(backend, BaseModel):
            backend = backend.model_dump()
        elif isinstance(backend, str):
            backend = {"kind": backend}
        elif backend is None:
            backend = {}
        elif not isinstance(backend, dict):
            return {**data, "backend": backend}  # pydantic's own error names it
        flat = {key: data.pop(key) for key in list(data) if key in _FLAT_KEYS}
        return {**data, "backend": {"kind": "docker", **backend, **flat}}

    def with_backend(self, **changes: Any) -> Self:
        """A copy whose backend config has `changes` (validated: a key that backend does not have is refused)."""
        backend = self.backend.model_validate({**self.backend.model_dump(), **changes})
        return super().model_copy(update={"backend": backend})

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """pydantic's copy, which sets whatever `update` names unchecked: here a flat key
        (`runtime`, `image`) goes into the backend's config, and a key no field has is refused, so
        that a copy never silently keeps the old value."""
        update = dict(update or {})
        unknown = set(update) - set(type(self).model_fields) - _FLAT_KEYS
        if unknown:
            raise TypeError(f"SandboxConfig has no field {', '.join(sorted(unknown))}")
        flat = {key: update.pop(key) for key in list(update) if key in _FLAT_KEYS}
        copy = super().model_copy(update=update, deep=deep)
        return copy.with_backend(**flat) if flat else copy
