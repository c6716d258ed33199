"""Opt-in egress: a per-session internal network whose only other member is our egress proxy.

The sandbox joins the internal network (Docker gives it no route out) and gets HTTP(S)_PROXY,
nothing else. The proxy (compose/proxy/egress_proxy.py) sits on that network and on an outer one,
and enforces the allow-list. Without egress, nothing changes: network_mode=none.
"""
from __future__ import annotations

import json
import logging
import os
import uuid
from typing import Any

import docker
import docker.errors
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..config import LABEL
from ..errors import ErrorType, OpenAgentsError

log = logging.getLogger(__name__)
PROXY_IMAGE = "openagents-egress-proxy:latest"
PROXY_ALIAS = "egress-proxy"
PROXY_PORT = 3128


class EgressConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    allow: list[str] = Field(default_factory=list, description="Hosts: exact, *.suffix, optional :port.")
    network: str | None = Field(default=None, description="Join this existing internal network (a shared gate, e.g. compose/) instead of starting one.")
    allow_cidrs: list[str] = Field(default_factory=list, description="Admin-level only: private networks the proxy may reach.")
    outer_network: str = Field(default_factory=lambda: os.environ.get("OA_EGRESS_OUTER_NETWORK", "bridge"),
                               description="The network the proxy reaches the world through (OA_EGRESS_OUTER_NETWORK).")
    proxy_image: str = PROXY_IMAGE

    @field_validator("allow")
    @classmethod
    def _hosts(cls, value: list[str]) -> list[str]:
        for host in value:
            if not host or any(c in host for c in " ,/@") or host.count(":") > 1:
                raise ValueError(f"not a host: {host!r}")
        return value

    @property
    def proxy_url(self) -> str:
        return f"http://{PROXY_ALIAS}:{PROXY_PORT}"

    def environment(self) -> dict[str, str]:
        url = self.proxy_url
        return {"HTTP_PROXY": url, "HTTPS_PROXY": url, "http_proxy": url, "https_proxy": url, "NO_PROXY": "", "no_proxy": ""}


class EgressGate:
    def __init__(self, client: docker.DockerClient, config: EgressConfig) -> None:
        self.client = client
        self.config = config
        self.id = uuid.uuid4().hex[:12]
        self.network = None
        self.proxy = None
        self._seen = 0

    @property
    def network_name(self) -> str:
        return self.config.network or f"oa-egress-{self.id}"

    def _join_shared(self) -> None:
        """A shared gate is the admin's: we only check that its network really is internal."""
        try:
            network = self.client.networks.get(self.config.network)
        except docker.errors.NotFound:
            raise OpenAgentsError(ErrorType.CONFIG_INVALID, f"egress network {self.config.network} does not exist") from None
        if not network.attrs.get("Internal"):
            raise OpenAgentsError(ErrorType.CONFIG_INVALID, f"egress network {self.config.network} is not internal: a sandbox there could skip the proxy")

    def start(self) -> None:
        if self.config.network:
            self._join_shared()
            return
        if not self.config.allow:
            raise OpenAgentsError(ErrorType.CONFIG_INVALID, "egress needs at least one allowed host")
        labels = {LABEL: "egress", f"{LABEL}.egress-id": self.id}
        try:
            self.client.images.get(self.config.proxy_image)
        except docker.errors.ImageNotFound:
            raise OpenAgentsError(ErrorType.IMAGE_MISSING, f"image {self.config.proxy_image} is missing; build it with `oa-sandbox image build`") from None
        try:
            self.network = self.client.networks.create(self.network_name, driver="bridge", internal=True, labels=labels)
            self.proxy = self.client.containers.run(
                self.config.proxy_image, detach=True, name=f"oa-egress-proxy-{self.id}", network=self.config.outer_network, labels=labels,
                environment={"OA_EGRESS_ALLOW": ",".join(self.config.allow), "OA_EGRESS_ALLOW_CIDRS": ",".join(self.config.allow_cidrs)},
                read_only=True, cap_drop=["ALL"], security_opt=["no-new-privileges"], mem_limit="256m", pids_limit=128,
            )
            self.network.connect(self.proxy, aliases=[PROXY_ALIAS])
        except docker.errors.DockerException as err:
            self.close()
            raise OpenAgentsError(ErrorType.SANDBOX_START_FAILED, f"could not start the egress gate: {err}") from None

    def drain(self) -> list[dict[str, Any]]:
        """The proxy's decisions since the last drain, for the transcript."""
        if self.proxy is None:
            return []
        try:
            lines = self.proxy.logs(stdout=True, stderr=False).decode("utf-8", errors="replace").splitlines()
        except docker.errors.DockerException:
            return []
        fresh, self._seen = lines[self._seen:], len(lines)
        records = []
        for line in fresh:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("decision") in ("allow", "deny", "error"):
                records.append({k: record.get(k) for k in ("method", "host", "port", "decision", "reason")})
        return records

    def close(self) -> None:
        if self.proxy is not None:
            try:
                self.proxy.remove(force=True)
            except docker.errors.DockerException:
                pass
            self.proxy = None
        if self.network is not None:
            try:
                self.network.remove()
            except docker.errors.DockerException as err:
                log.debug("removing %s: %s", self.network_name, err)
            self.network = None
