"""The page: Jinja2 with autoescape on, the template and stylesheet shipped as package data.

Nothing box-written is marked safe: every value reaches the template as plain text (collect and
changes made it visible and bounded) and is escaped there for HTML text and attributes alike. The
page carries no script at all and no link built from session data. Its Content-Security-Policy
(a meta element, the first thing in <head>) is `default-src 'none'` with the one stylesheet
allowed by its sha256 hash: no script runs, nothing is fetched, no inline style attribute applies,
even if some value were ever to slip through unescaped.
"""

from __future__ import annotations

import base64
import hashlib
import time
from importlib import resources
from typing import Any

import jinja2
from markupsafe import Markup

from .limits import MAX_PAGE_BYTES

_ENV: jinja2.Environment | None = None


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def _env() -> jinja2.Environment:
    global _ENV
    if _ENV is None:
        env = jinja2.Environment(
            autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True
        )
        env.filters["when"] = lambda ts: (
            time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts)) if isinstance(ts, (int, float)) else ""
        )
        env.globals["template"] = env.from_string(_asset("report.html.j2"))
        _ENV = env
    return _ENV


def csp(style: str) -> str:
    digest = base64.b64encode(hashlib.sha256(style.encode("utf-8")).digest()).decode("ascii")
    return (
        f"default-src 'none'; style-src 'sha256-{digest}'; img-src 'none'; script-src 'none'; base-uri 'none'; "
        "form-action 'none'; connect-src 'none'; font-src 'none'; media-src 'none'; object-src 'none'; frame-src 'none'"
    )


def render(context: dict[str, Any]) -> str:
    """The page for `context` (report.build's); the stylesheet is ours, the one thing marked safe."""
    style = _asset("report.css")
    template: jinja2.Template = _env().globals["template"]  # type: ignore[assignment]
    return template.render(**context, style=Markup(style), csp=csp(style), max_page_mib=MAX_PAGE_BYTES >> 20)
