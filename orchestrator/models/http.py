"""The one HTTP model client: a family's dialect (models/dialects/) over httpx, with the retries,
timeouts, bounds and streaming every family shares, written once.

What it owns: POST with retries on 429, 5xx and transport errors (tenacity; Retry-After honoured;
bounded in attempts and total time), a read timeout that is never waited out twice
(--model-timeout), error bodies and whole answers read with a cap, streams parsed with bounds
(models/stream.py) and not asked again once text was shown. What it does not own: any family's
URL, headers, body, answer shape or error events (the dialect's).

`transport` is httpx's own seam: tests hand it an `httpx.MockTransport` (or use a loopback server
and none), so the client is driven exactly as in production, sockets aside."""

from __future__ import annotations

import email.utils
import socket
import time
import urllib.request
from typing import Any, Callable
from urllib.parse import urlsplit

import httpx
from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt, stop_after_delay

from sandbox_agent import jsonbound

from ..errors import ErrorType, OpenAgentsError
from .base import DEFAULT_MODEL_TIMEOUT_S, Message, ModelTurn, RetryableModelError, RetryNotice, RetryPolicy, TextSink
from .dialects import Assembler, Dialect
from .stream import StreamLimits, sse_events

ERROR_BODY_CAP = 64 * 1024  # a refusal's body, or an answer that should have been one JSON object but was not streamed


class HttpModelClient:
    """A model reached over HTTP, in one family's dialect. `stream`: ask for server-sent events and
    hand text to `on_text` as it comes (a server that answers whole anyway is read whole)."""

    def __init__(
        self,
        dialect: Dialect,
        name: str,
        base_url: str,
        key: str,
        retry: RetryPolicy | None = None,
        timeout_s: float = DEFAULT_MODEL_TIMEOUT_S,
        stream: bool = True,
        transport: httpx.BaseTransport | None = None,
        limits: StreamLimits | None = None,
    ) -> None:
        self.dialect = dialect
        self.family = dialect.family
        self.name = name
        self.base_url = base_url
        self.stream = stream
        self._headers = dialect.headers(key)
        self._retry = retry or RetryPolicy()
        self._limits = limits or StreamLimits()
        self._http = http_client(timeout_s, transport)

    def preflight(self) -> None:
        preflight(self.base_url, self.dialect.what)

    def complete(
        self, messages: list[Message], tools: list[dict[str, Any]], on_text: TextSink | None = None
    ) -> ModelTurn:
        body = self.dialect.request(self.name, messages, tools, self.stream)
        url = self.dialect.url(self.base_url, self.name, self.stream)
        attempt = self._streamed(url, body, on_text) if self.stream else self._whole(url, body)
        retrying = _retrying(self._retry)
        try:
            turn: ModelTurn = retrying(attempt)
        except RetryableModelError as err:
            raise OpenAgentsError(
                ErrorType.MODEL_API_ERROR,
                f"{self.dialect.what} failed after {retrying.statistics.get('attempt_number', '?')} attempts: {err}",
            ) from None
        return turn

    def _whole(self, url: str, body: dict[str, Any]) -> Callable[[], ModelTurn]:
        def attempt() -> ModelTurn:
            try:
                response = self._http.post(url, json=body, headers=self._headers)
            except httpx.ReadTimeout as err:
                raise self._silent(err) from None
            except httpx.TransportError as err:
                raise RetryableModelError(f"{type(err).__name__}: {err}") from None
            if response.status_code >= 400:
                raise self._refused(response, response.text)
            return self.dialect.parse(_object(response.content))

        return attempt

    def _streamed(self, url: str, body: dict[str, Any], on_text: TextSink | None) -> Callable[[], ModelTurn]:
        def attempt() -> ModelTurn:
            built: Assembler = self.dialect.assembler(on_text)
            try:
                with self._http.stream("POST", url, json=body, headers=self._headers) as response:
                    if response.status_code >= 400:
                        raise self._refused(response, _read_capped(response).decode("utf-8", "replace"))
                    kind = response.headers.get("content-type", "")
                    if (
                        "json" in kind and "event-stream" not in kind
                    ):  # a server that ignored `stream` answered with one object
                        return self.dialect.parse(_object(_read_capped(response, self._limits.max_event_bytes)))
                    for event in sse_events(response.iter_bytes(), self._limits):
                        built.feed(event)
                    return built.turn()
            except httpx.ReadTimeout as err:
                raise self._silent(err) from None
            except httpx.TransportError as err:
                if built.shown:
                    raise OpenAgentsError(
                        ErrorType.MODEL_API_ERROR,
                        f"{self.dialect.what}: the stream broke off: {type(err).__name__}: {err}",
                    ) from None
                raise RetryableModelError(f"{type(err).__name__}: {err}") from None
            except RetryableModelError as err:
                if built.shown:
                    raise OpenAgentsError(
                        ErrorType.MODEL_API_ERROR, f"{self.dialect.what}: the stream broke off: {err}"
                    ) from None
                raise

        return attempt

    def _refused(self, response: httpx.Response, text: str) -> Exception:
        status = response.status_code
        if self.dialect.retryable(status):
            return RetryableModelError(f"HTTP {status}: {text[:200]}", _retry_after(response))
        return OpenAgentsError(
            ErrorType.MODEL_API_ERROR, f"{self.dialect.what} refused the request: HTTP {status}: {text[:300]}"
        )

    def _silent(self, err: httpx.TimeoutException) -> OpenAgentsError:
        timeout_s = self._http.timeout.read
        limit = f"{timeout_s:g} s" if timeout_s else "its timeout"
        return OpenAgentsError(
            ErrorType.MODEL_API_ERROR,
            f"{self.dialect.what} sent nothing for {limit} (--model-timeout): {type(err).__name__}",
        )


def http_client(timeout_s: float, transport: httpx.BaseTransport | None = None) -> httpx.Client:
    """`timeout_s` is the most any one wait may take (connecting, or the silence between two pieces
    of an answer); the connection itself gets at most 10 s of it."""
    return httpx.Client(timeout=httpx.Timeout(timeout_s, connect=min(10.0, timeout_s)), transport=transport)


def _object(raw: bytes) -> dict[str, Any]:
    """A whole answer: JSON (depth-bounded, sandbox_agent/jsonbound) and an object, or worth another try."""
    try:
        data = jsonbound.loads(raw)
    except ValueError:
        raise RetryableModelError(f"the answer is not JSON: {raw[:120]!r}") from None
    if not isinstance(data, dict):
        raise RetryableModelError("the answer is not a JSON object")
    return data


def _read_capped(response: httpx.Response, cap: int = ERROR_BODY_CAP) -> bytes:
    out = bytearray()
    for chunk in response.iter_bytes():
        out += chunk
        if len(out) > cap:
            raise RetryableModelError(f"the answer is over {cap} bytes where one JSON object was expected")
    return bytes(out)


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        parsed = email.utils.parsedate_to_datetime(value)
        return max(0.0, parsed.timestamp() - time.time()) if parsed else None


def _retrying(policy: RetryPolicy) -> Retrying:
    def wait(state: RetryCallState) -> float:
        err = state.outcome.exception() if state.outcome else None
        if isinstance(err, RetryableModelError) and err.retry_after is not None:
            return min(err.retry_after, policy.max_delay_s)
        return min(policy.base_delay_s * 2.0 ** (state.attempt_number - 1), policy.max_delay_s)

    def before_sleep(state: RetryCallState) -> None:
        if policy.on_retry is None:
            return
        err = state.outcome.exception() if state.outcome else None
        problem = str(err).split(":", 1)[0] if isinstance(err, RetryableModelError) else "failed"
        delay = state.next_action.sleep if state.next_action else 0.0
        try:
            policy.on_retry(
                RetryNotice(
                    attempt=state.attempt_number, max_attempts=policy.max_attempts, delay_s=delay, problem=problem
                )
            )
        except Exception:  # noqa: BLE001 - progress must never break a request
            pass

    return Retrying(
        retry=retry_if_exception_type(RetryableModelError),
        stop=stop_after_attempt(policy.max_attempts) | stop_after_delay(policy.max_total_s),
        wait=wait,
        before_sleep=before_sleep,
        reraise=True,
    )


def preflight(base_url: str, what: str, timeout_s: float = 3.0) -> None:
    """Whether anything listens at the model's endpoint (or the proxy that reaches it): a TCP
    connection, no request, no key sent. A refused port or an unknown host is a typed
    MODEL_API_ERROR in about a second, before any sandbox starts; a slow network is let through
    (the request's own timeout and retries judge it)."""
    parts = urlsplit(base_url)
    host = parts.hostname or ""
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise OpenAgentsError(
            ErrorType.CONFIG_INVALID, f"the model's base URL {base_url!r} has no valid port"
        ) from None
    if parts.scheme not in ("http", "https") or not host:
        raise OpenAgentsError(ErrorType.CONFIG_INVALID, f"the model's base URL {base_url!r} is not an http(s) URL")
    proxies = urllib.request.getproxies()
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if proxy and not urllib.request.proxy_bypass(host):
        target = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        host, port, via = (
            target.hostname or host,
            target.port or 80,
            f" through the proxy {target.hostname}:{target.port or 80}",
        )
    else:
        via = ""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return
    except (socket.timeout, TimeoutError):
        return
    except socket.gaierror as err:
        raise OpenAgentsError(
            ErrorType.MODEL_API_ERROR,
            f"{what} at {base_url}: the host {host!r} is unknown{via} ({err.strerror}); nothing was started",
        ) from None
    except OSError as err:
        raise OpenAgentsError(
            ErrorType.MODEL_API_ERROR,
            f"{what} at {base_url}: cannot connect to {host}:{port}{via} ({err.strerror or err}); nothing was started",
        ) from None
