"""Opt-in egress: a per-session internal network whose only other member is our egress proxy.

The sandbox joins the internal network (Docker gives it no route out) and gets HTTP(S)_PROXY,
nothing else. The proxy (compose/proxy/egress_gate/) sits on that network and on an outer one,
and enforces the allow-list. Without egress, nothing changes: network_mode=none.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors
from docker.models.containers import Container
from docker.models.networks import Network
from docker.types import LogConfig

from sandbox_agent import jsonbound

from ..config import EGRESS_PROXY_ALIAS, LABEL, EgressConfig, EgressRule
from ..errors import ErrorType, OpenAgentsError
from ..protocol import EgressRecord
from . import owner, reaper
from .daemon import DOCKER_ERRORS
from .egress_tls import SessionCA
from .engine import engine_settings

log = logging.getLogger(__name__)

# drain() reads the proxy's decisions from its log, so the proxy keeps one, rotated: at most
# 3 x 10 MB on the host's disk however many requests the box makes.
PROXY_LOG_CONFIG = LogConfig(type=LogConfig.types.JSON, config={"max-size": "10m", "max-file": "3"})
# The drain's mark (drain()): the proxy's signal numbers and nonces (compose/proxy/egress_gate/audit.py), how
# long a drain waits for its mark in all (the proxy's grace for open connections is 1 s), how often it asks again.
MARK_SIGNAL_BASE = 50
MARK_NONCES = 8
MARK_WAIT_S = 5.0
MARK_RESEND_S = 1.5
MAX_DRAIN_BYTES = 8 << 20  # of log per read: past it the rest waits for the next drain
MAX_RECORDS_PER_DRAIN = 200  # per call: past this the transcript gets one line saying how many more
MAX_HOST_CHARS = 255  # longer is no DNS name; the proxy refuses it, and we never copy it whole
MAX_TEXT_CHARS = 512
MAX_PATH_CHARS = 256
LIVE_RULES = "/tmp/oa-egress-live.json"  # in the gate's private tmpfs; written only by `docker exec` from the host
# Writes argv[2] to argv[1] atomically, inside the gate container (python3 -I -S: nothing of the image's site).
_WRITE_LIVE = (
    "import os, sys; p = sys.argv[1]; t = p + '.new'; f = open(t, "
    "'w'); f.write(sys.argv[2]); f.close(); os.replace(t, p)"
)


# A widening offer names one literal request (issue 41): a method is an RFC 9110 token without `*`
# (one method, never "any"), the host a name or IP literal the gate normalised (no pattern), the path
# the canonical one the gate checked and forwarded (visible ASCII, its glob characters escaped below).
_OFFER_METHOD = re.compile(r"[!#$%&'+.^_`|~0-9A-Z-]{1,16}\Z")
_OFFER_HOST = re.compile(r"(?:[a-z0-9_-]{1,63}\.)*[a-z0-9_-]{1,63}\Z|\[[0-9a-f:.]{2,45}\]\Z")
_OFFER_PATH = re.compile(r"/[\x21-\x7e]{0,1023}\Z")


def widening_offer(
    method: str | None, host: str, port: int | None, path: str | None, tls: str | None
) -> tuple[EgressRule, str] | None:
    """The rule that allows exactly the refused request a person is shown, and the words shown; None
    when the record does not name one literal request (a cut or odd field, a method `*`). A tunnel
    the gate did not open is offered as its whole host and port (the gate cannot see its paths)."""
    if port is None or not _OFFER_HOST.match(host or ""):
        return None
    if tls == "tunnel" or method == "CONNECT":
        try:
            return EgressRule(
                action="allow", host=host, port=port
            ), f"every request to {host}:{port} (a TLS tunnel the gate cannot see into)"
        except ValueError:
            return None
    if (
        method is None
        or path is None
        or not _OFFER_METHOD.match(method)
        or not _OFFER_PATH.match(path)
        or "\u2026[cut" in path
    ):
        return None
    literal = re.sub(r"([*?\[])", r"[\1]", path)  # the exact path as a glob that matches only itself
    try:
        rule = EgressRule(action="allow", host=host, port=port, methods=[method], path=literal)
    except ValueError:  # pydantic's ValidationError is one: a path too long once escaped
        return None
    return rule, f"{method} {host}:{port}{path}"


@dataclass
class _Taken:
    records: list[EgressRecord] = field(default_factory=list)
    omitted: int = 0


class EgressGate:
    def __init__(self, client: docker.DockerClient, config: EgressConfig) -> None:
        self.client = client
        self.config = config
        self.id = uuid.uuid4().hex[:12]
        self.network: Network | None = None
        self.proxy: Container | None = None
        self._seen_seq = 0
        self._since = 0
        self._nonce = 0
        self._drain_lock = threading.Lock()  # one drain at a time: each waits for its own mark
        self.ca: SessionCA | None = None  # made when a credential rule asks the gate to open TLS
        self.widened: list[dict[str, Any]] = []  # rules the person allowed live, this session only

    @property
    def network_name(self) -> str:
        return self.config.network or f"oa-egress-{self.id}"

    def _join_shared(self) -> None:
        """A shared gate is the admin's: we only check that its network really is internal."""
        assert self.config.network is not None  # start() asks for a shared gate only when one is named
        try:
            network = self.client.networks.get(self.config.network)
        except docker.errors.NotFound:
            raise OpenAgentsError(
                ErrorType.CONFIG_INVALID, f"egress network {self.config.network} does not exist"
            ) from None
        if not network.attrs.get("Internal"):
            raise OpenAgentsError(
                ErrorType.CONFIG_INVALID,
                f"egress network {self.config.network} is not internal: a sandbox there could skip the proxy",
            )

    def start(self) -> None:
        if self.config.network:
            if self.config.rules or self.config.credentials:
                raise OpenAgentsError(
                    ErrorType.CONFIG_INVALID,
                    "egress rules and credentials need a per-session gate, not a shared network",
                )
            self._join_shared()
            return
        if not self.config.allow and not any(rule.action == "allow" for rule in self.config.rules):
            raise OpenAgentsError(ErrorType.CONFIG_INVALID, "egress needs at least one allowed host")
        environment = self._proxy_environment()
        labels = {
            LABEL: "egress",
            f"{LABEL}.egress-id": self.id,
            **owner.labels_here(),
        }  # reaped with its owner (reaper.py)
        try:
            self.client.images.get(self.config.proxy_image)
        except docker.errors.ImageNotFound:
            raise OpenAgentsError(
                ErrorType.IMAGE_MISSING,
                f"image {self.config.proxy_image} is missing; build it with `oa-sandbox image build`",
            ) from None
        try:
            network = self.network = self.client.networks.create(
                self.network_name, driver="bridge", internal=True, labels=labels
            )
            settings = dict(
                image=self.config.proxy_image,
                detach=True,
                name=f"oa-egress-proxy-{self.id}",
                network=self.config.outer_network,
                labels=labels,
                environment=environment,
                tmpfs={"/tmp": "rw,nosuid,nodev,noexec,size=1m,mode=1777"},
                read_only=True,
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                mem_limit="256m",
                pids_limit=128,
                log_config=PROXY_LOG_CONFIG,
            )
            proxy = self.proxy = self.client.containers.run(**engine_settings(self.client, settings))
            network.connect(proxy, aliases=[EGRESS_PROXY_ALIAS])
        except DOCKER_ERRORS as err:
            self.close()
            raise OpenAgentsError(ErrorType.SANDBOX_START_FAILED, f"could not start the egress gate: {err}") from None

    def _proxy_environment(self) -> dict[str, str]:
        """The gate's configuration. Credentials are resolved here, from the host's environment, and
        go to the gate only (its container's environment, which the box cannot read)."""
        config = self.config
        env = {
            "OA_EGRESS_ALLOW": ",".join(config.allow),
            "OA_EGRESS_ALLOW_CIDRS": ",".join(config.allow_cidrs),
            "OA_EGRESS_RULE_SET": config.rule_set,
            "OA_EGRESS_LIVE_RULES": LIVE_RULES,
            "OA_EGRESS_RULES": json.dumps(
                [{**rule.model_dump(), "name": f"rules[{i}]"} for i, rule in enumerate(config.rules)]
            ),
        }
        if config.credentials:
            try:
                # the variables' values too: the gate blanks each of them in responses (an API that echoes)
                resolved = [
                    {**c.model_dump(), "value": c.resolve(), "secrets": [os.environ[name] for name in c.variables]}
                    for c in config.credentials
                ]
            except ValueError as err:
                raise OpenAgentsError(ErrorType.CONFIG_INVALID, str(err)) from None
            self.ca = SessionCA([c.host for c in config.credentials])
            env["OA_EGRESS_CREDENTIALS"] = json.dumps(resolved)
            env["OA_EGRESS_INTERCEPT"] = json.dumps(self.ca.leaves)
        if config.upstream_ca:
            try:
                env["OA_EGRESS_UPSTREAM_CA"] = Path(config.upstream_ca).read_text()
            except (OSError, UnicodeDecodeError) as err:
                raise OpenAgentsError(
                    ErrorType.CONFIG_INVALID, f"egress upstream_ca {config.upstream_ca}: {err}"
                ) from None
        return env

    def widen(self, rule: EgressRule, once: bool) -> bool:
        """Adds an allow rule to the running gate, for this session only (after every configured
        rule: it decides only what none of them matched). False when the gate could not take it."""
        if self.proxy is None:
            return False
        self.widened.append({**rule.model_dump(), "id": len(self.widened), "once": once})
        try:
            result = self.proxy.exec_run(
                ["python3", "-I", "-S", "-c", _WRITE_LIVE, LIVE_RULES, json.dumps(self.widened)], user="65534:65534"
            )
        except DOCKER_ERRORS:
            self.widened.pop()
            return False
        if result.exit_code != 0:
            self.widened.pop()
            return False
        return True

    def drain(self) -> list[EgressRecord]:
        """The proxy's decisions since the last drain: the records of the call that just ended.

        Docker copies the proxy's stdout to its log asynchronously, so reading the log right after a
        call may miss the call's last records (they would go to the next call). So the drain asks
        the proxy for a mark (a real-time signal carrying a nonce; egress_gate/audit.py writes the
        mark after the connections open at that moment have logged) and reads until the mark with
        its nonce is in the log: every record before it is then there, and records after it are
        the next call's. Bounded: MARK_WAIT_S in all, MAX_DRAIN_BYTES of log per read; a proxy
        that never marks (gone, stuck) costs the wait once per call and loses no record, which
        the next drain finds.
        """
        if self.proxy is None or self.proxy.id is None:
            return []
        with self._drain_lock:
            nonce, self._nonce = self._nonce, (self._nonce + 1) % MARK_NONCES
            took = _Taken()
            started = time.monotonic()
            asked_at = -MARK_RESEND_S
            pause = 0.002
            while True:
                if (
                    time.monotonic() - asked_at >= MARK_RESEND_S
                ):  # again after a while: a signal before the proxy listened is lost
                    asked_at = time.monotonic()
                    if not self._ask_mark(nonce):
                        self._take(self._read_log(), None, took)  # no proxy to mark: what its log holds
                        break
                if self._take(self._read_log(), nonce, took):
                    break
                if time.monotonic() - started > MARK_WAIT_S:
                    log.warning(
                        "the egress gate did not mark its log within %.0fs: "
                        "the rest of this call's records go with the next",
                        MARK_WAIT_S,
                    )
                    break
                time.sleep(pause)
                pause = min(pause * 1.5, 0.1)
        if took.omitted:
            took.records.append(
                EgressRecord(
                    decision="omitted",
                    reason=f"{took.omitted} more egress decisions in this call are not recorded "
                    f"(more than {MAX_RECORDS_PER_DRAIN})",
                )
            )
        return took.records

    def _ask_mark(self, nonce: int) -> bool:
        assert self.proxy is not None and self.proxy.id is not None
        try:
            self.client.api.kill(self.proxy.id, signal=MARK_SIGNAL_BASE + nonce)
        except DOCKER_ERRORS:
            return False
        return True

    def _read_log(self) -> list[bytes]:
        """The proxy's log lines since the second of the last line taken (Docker's `since` has whole
        seconds; the overlap is dropped by `seq`), at most MAX_DRAIN_BYTES of them."""
        assert self.proxy is not None
        try:
            stream = self.proxy.logs(stdout=True, stderr=False, since=self._since or None, stream=True, follow=False)
        except DOCKER_ERRORS:
            return []
        data = b""
        try:
            for chunk in stream:
                data += chunk
                if len(data) >= MAX_DRAIN_BYTES:
                    break
        except DOCKER_ERRORS:
            pass
        finally:
            close = getattr(stream, "close", None)
            if callable(close):
                close()
        return data.split(b"\n")[:-1]  # the last is empty, or a line cut at the bound: read again next time

    def _take(self, lines: list[bytes], nonce: int | None, took: _Taken) -> bool:
        """Takes the records after the last seen, up to and including the mark for `nonce`: True when
        that mark was among them (what follows it is the next call's, left for the next drain)."""
        for line in lines:
            try:
                record = jsonbound.loads(line.decode("utf-8", errors="replace"))
            except ValueError:
                continue
            if (
                not isinstance(record, dict)
                or not isinstance(record.get("seq"), int)
                or record["seq"] <= self._seen_seq
            ):
                continue
            self._seen_seq = record["seq"]
            ts = record.get("ts")
            self._since = max(self._since, int(ts) if isinstance(ts, (int, float)) else 0)
            decision = record.get("decision")
            if decision == "mark":
                if nonce is not None and record.get("nonce") == nonce:
                    return True
            elif decision in ("allow", "deny", "error"):
                if len(took.records) < MAX_RECORDS_PER_DRAIN:
                    took.records.append(bounded_record(record))
                else:
                    took.omitted += 1
        return False

    def close(self) -> bool:
        """Remove the proxy, then the network, each confirmed gone; False when one is still there (a
        warning named it)."""
        gone = True
        proxy, self.proxy = self.proxy, None
        if proxy is not None and proxy.id is not None:  # docker-py's objects carry the id the daemon gave
            gone &= reaper.remove_container(self.client, proxy.id) is not reaper.Removal.FAILED
        network, self.network = self.network, None
        if network is not None and network.id is not None:
            gone &= reaper.remove_network(self.client, network.id) is not reaper.Removal.FAILED
        ca, self.ca = self.ca, None
        if ca is not None:
            ca.close()
        return gone


def _bounded_text(value: Any, limit: int, keep: int | None = None) -> str | None:
    """`value` as text of at most `limit` chars; longer, only its first `keep` chars and a marker."""
    if value is None:
        return None
    text, keep = str(value), limit if keep is None else keep
    return text if len(text) <= limit else f"{text[:keep]}…[cut {len(text) - keep} chars]"


def bounded_record(record: dict[str, Any]) -> EgressRecord:
    """What the transcript keeps of one decision: every field short, whatever the box sent the proxy
    (the host name and the reason quote the request)."""

    def count(value: Any) -> int | None:
        return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 62 else None

    ts = record.get("ts")
    return EgressRecord(
        time=ts if isinstance(ts, (int, float)) and not isinstance(ts, bool) and math.isfinite(ts) else None,
        method=_bounded_text(record.get("method"), 16),
        host=_bounded_text(record.get("host"), MAX_HOST_CHARS, keep=64),
        port=count(record.get("port")),
        path=_bounded_text(record.get("path"), MAX_PATH_CHARS),  # the proxy logs it with the query stripped
        decision=str(record.get("decision")),
        rule=_bounded_text(record.get("rule"), 200),
        reason=_bounded_text(record.get("reason"), MAX_TEXT_CHARS),
        bytes_up=count(record.get("bytes_up")),
        bytes_down=count(record.get("bytes_down")),
        credential=record.get("credential") is True,  # whether one was injected; never its value
        tls=_bounded_text(record.get("tls"), 16),
    )
