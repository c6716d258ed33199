"""A model-neutral conversation, the client interface, and retries shared by the HTTP clients."""
from __future__ import annotations

import email.utils
import ipaddress
import os
import socket
import time
import urllib.request
from typing import Any, Callable, Literal, Protocol
from urllib.parse import urlsplit

import httpx
from pydantic import BaseModel, Field
from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt, stop_after_delay

from sandbox_agent import jsonbound

from ..errors import ErrorType, OpenAgentsError
from ..tools.call import ToolCall
from .stream import SSEEvent, StreamLimits, sse_events


class ModelTurn(BaseModel):
    text: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    usage: dict[str, Any] = Field(default_factory=dict)


class Message(BaseModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None


TextSink = Callable[[str], None]  # streamed text, piece by piece, as it arrives


class ModelClient(Protocol):
    family: str  # "openai", "gemini" or "anthropic": which tool declarations this model receives
    name: str

    def complete(self, messages: list[Message], tools: list[dict[str, Any]], on_text: TextSink | None = None) -> ModelTurn: ...


class RetryableModelError(Exception):
    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class RetryNotice(BaseModel):
    """One failed attempt that will be tried again: said as it happens (`429, retry 2/5 in 4 s`)."""

    attempt: int  # the attempt that failed, 1-based
    max_attempts: int
    delay_s: float
    problem: str

    def line(self) -> str:
        return f"{self.problem}, retry {self.attempt + 1}/{self.max_attempts} in {self.delay_s:.0f} s"


class RetryPolicy(BaseModel):
    max_attempts: int = 5
    max_total_s: float = 120.0
    base_delay_s: float = 1.0
    max_delay_s: float = 30.0
    on_retry: Callable[[RetryNotice], None] | None = None  # progress for whoever watches


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        parsed = email.utils.parsedate_to_datetime(value)
        return max(0.0, parsed.timestamp() - time.time()) if parsed else None


def _wait(policy: RetryPolicy) -> Callable[[RetryCallState], float]:
    def wait(state: RetryCallState) -> float:
        err = state.outcome.exception() if state.outcome else None
        if isinstance(err, RetryableModelError) and err.retry_after is not None:
            return min(err.retry_after, policy.max_delay_s)
        return min(policy.base_delay_s * 2.0 ** (state.attempt_number - 1), policy.max_delay_s)

    return wait


DEFAULT_MODEL_TIMEOUT_S = 300.0  # --model-timeout: the longest the model server may stay silent


def http_client(timeout_s: float) -> httpx.Client:
    """The clients' HTTP: `timeout_s` is the most any one wait may take (connecting, or the silence
    between two pieces of an answer); the connection itself gets at most 10 s of it."""
    return httpx.Client(timeout=httpx.Timeout(timeout_s, connect=min(10.0, timeout_s)))


def _silent(err: httpx.TimeoutException, what: str, timeout_s: float | None) -> OpenAgentsError:
    limit = f"{timeout_s:g} s" if timeout_s else "its timeout"
    return OpenAgentsError(ErrorType.MODEL_API_ERROR, f"{what} sent nothing for {limit} (--model-timeout): {type(err).__name__}")


def _retrying(policy: RetryPolicy) -> Retrying:
    def before_sleep(state: RetryCallState) -> None:
        if policy.on_retry is None:
            return
        err = state.outcome.exception() if state.outcome else None
        problem = str(err).split(":", 1)[0] if isinstance(err, RetryableModelError) else "failed"
        delay = state.next_action.sleep if state.next_action else 0.0
        try:
            policy.on_retry(RetryNotice(attempt=state.attempt_number, max_attempts=policy.max_attempts, delay_s=delay, problem=problem))
        except Exception:  # noqa: BLE001 - progress must never break a request
            pass

    return Retrying(
        retry=retry_if_exception_type(RetryableModelError),
        stop=stop_after_attempt(policy.max_attempts) | stop_after_delay(policy.max_total_s),
        wait=_wait(policy),
        before_sleep=before_sleep,
        reraise=True,
    )


def _with_retries(policy: RetryPolicy, what: str, attempt: Callable[[], Any]) -> Any:
    retrying = _retrying(policy)
    try:
        return retrying(attempt)
    except RetryableModelError as err:
        raise OpenAgentsError(
            ErrorType.MODEL_API_ERROR, f"{what} failed after {retrying.statistics.get('attempt_number', '?')} attempts: {err}"
        ) from None


def _refused(status: int, text: str, what: str, response: httpx.Response) -> Exception:
    """429, 5xx (Anthropic's 529 overloaded among them) are worth another try; other 4xx are not."""
    if status == 429 or status >= 500:
        return RetryableModelError(f"HTTP {status}: {text[:200]}", _retry_after(response))
    return OpenAgentsError(ErrorType.MODEL_API_ERROR, f"{what} refused the request: HTTP {status}: {text[:300]}")


def post_json(http: httpx.Client, url: str, body: dict[str, Any], headers: dict[str, str], policy: RetryPolicy, what: str) -> dict[str, Any]:
    """POST with retries on 429, 5xx and transport errors; honours Retry-After; bounded in attempts
    and total time; a typed MODEL_API_ERROR when they run out, the answer is not JSON, or the server
    stays silent past the read timeout (--model-timeout: never waited for again)."""

    def attempt() -> dict[str, Any]:
        try:
            response = http.post(url, json=body, headers=headers)
        except httpx.ReadTimeout as err:
            raise _silent(err, what, http.timeout.read) from None
        except httpx.TransportError as err:
            raise RetryableModelError(f"{type(err).__name__}: {err}") from None
        if response.status_code >= 400:
            raise _refused(response.status_code, response.text, what, response)
        try:
            data = jsonbound.loads(response.content)
        except ValueError:
            raise RetryableModelError(f"the answer is not JSON: {response.text[:120]!r}") from None
        if not isinstance(data, dict):
            raise RetryableModelError("the answer is not a JSON object")
        return data

    result: dict[str, Any] = _with_retries(policy, what, attempt)
    return result


class StreamAssembler(Protocol):
    """Builds one ModelTurn from a streamed answer's events (one per attempt). `shown` says whether
    any text went to the watcher already: after that an attempt that fails is not made again (the
    text would be said twice), it is a typed error."""

    shown: bool

    def feed(self, event: SSEEvent) -> None: ...

    def whole(self, data: dict[str, Any]) -> None: ...  # a server that ignored `stream` answered with one object

    def turn(self) -> ModelTurn: ...


ERROR_BODY_CAP = 64 * 1024


def post_stream(http: httpx.Client, url: str, body: dict[str, Any], headers: dict[str, str], policy: RetryPolicy, what: str,
                assembler: Callable[[], StreamAssembler], limits: StreamLimits | None = None) -> ModelTurn:
    """POST asking for a streamed answer and assemble it as it comes, with post_json's retries while
    nothing has been shown; the stream is parsed with bounds (models/stream.py)."""

    def attempt() -> ModelTurn:
        built = assembler()
        try:
            with http.stream("POST", url, json=body, headers=headers) as response:
                if response.status_code >= 400:
                    raise _refused(response.status_code, _read_capped(response).decode("utf-8", "replace"), what, response)
                if "json" in response.headers.get("content-type", "") and "event-stream" not in response.headers.get("content-type", ""):
                    try:
                        data = jsonbound.loads(_read_capped(response, (limits or StreamLimits()).max_event_bytes))
                    except ValueError:
                        raise RetryableModelError("the answer is not JSON") from None
                    if not isinstance(data, dict):
                        raise RetryableModelError("the answer is not a JSON object")
                    built.whole(data)
                else:
                    for event in sse_events(response.iter_bytes(), limits):
                        built.feed(event)
                return built.turn()
        except httpx.ReadTimeout as err:
            raise _silent(err, what, http.timeout.read) from None
        except httpx.TransportError as err:
            if built.shown:
                raise OpenAgentsError(ErrorType.MODEL_API_ERROR, f"{what}: the stream broke off: {type(err).__name__}: {err}") from None
            raise RetryableModelError(f"{type(err).__name__}: {err}") from None
        except RetryableModelError as err:
            if built.shown:
                raise OpenAgentsError(ErrorType.MODEL_API_ERROR, f"{what}: the stream broke off: {err}") from None
            raise

    turn: ModelTurn = _with_retries(policy, what, attempt)
    return turn


def _read_capped(response: httpx.Response, cap: int = ERROR_BODY_CAP) -> bytes:
    out = bytearray()
    for chunk in response.iter_bytes():
        out += chunk
        if len(out) > cap:
            raise RetryableModelError(f"the answer is over {cap} bytes where one JSON object was expected")
    return bytes(out)


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
        raise OpenAgentsError(ErrorType.CONFIG_INVALID, f"the model's base URL {base_url!r} has no valid port") from None
    if parts.scheme not in ("http", "https") or not host:
        raise OpenAgentsError(ErrorType.CONFIG_INVALID, f"the model's base URL {base_url!r} is not an http(s) URL")
    proxies = urllib.request.getproxies()
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if proxy and not urllib.request.proxy_bypass(host):
        target = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        host, port, via = target.hostname or host, target.port or 80, f" through the proxy {target.hostname}:{target.port or 80}"
    else:
        via = ""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return
    except (socket.timeout, TimeoutError):
        return
    except socket.gaierror as err:
        raise OpenAgentsError(ErrorType.MODEL_API_ERROR, f"{what} at {base_url}: the host {host!r} is unknown{via} ({err.strerror}); "
                                                         "nothing was started") from None
    except OSError as err:
        raise OpenAgentsError(ErrorType.MODEL_API_ERROR, f"{what} at {base_url}: cannot connect to {host}:{port}{via} "
                                                         f"({err.strerror or err}); nothing was started") from None


def local_endpoint(base_url: str | None) -> bool:
    """A server on this machine or a private network (llama.cpp, vLLM, Ollama): no key needed."""
    if not base_url:
        return False
    host = (urlsplit(base_url).hostname or "").strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_private or address.is_link_local


def api_key(var: str, base_url: str | None = None) -> str:
    """The key from `var`; optional (empty) for a loopback or private `base_url`."""
    value = os.environ.get(var, "")
    if not value and not local_endpoint(base_url):
        raise OpenAgentsError(ErrorType.CONFIG_INVALID, f"the model's key is not set: export {var}=... "
                                                        "(a server on loopback or a private address needs none)")
    return value
