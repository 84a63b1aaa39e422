"""Endpoint URLs: joined with a URL parser, and redacted wherever they are written or printed.

`--endpoint http://user:pass@host:30000/?api_key=...` must reach the server as given (httpx turns
userinfo into basic auth and keeps the query), but no password, token or key may reach a
manifest, a rejects file, a log line or an error message: `redact_text` replaces userinfo and
secret-looking query values with `***`.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

MASK = "***"
# Query keys whose values are credentials (api_key, access_token, X-Amz-Signature, sig, ...).
_SECRET_KEY = re.compile(r"key|token|secret|pass|pwd|auth|sig|credential|session|cookie", re.I)
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]+")
# `user:secret@host` not preceded by `://` (the URL pattern handles those); the host must follow.
_SCHEMELESS_USERINFO = re.compile(
    r"(^|[\s'\"=(\[,])(?![A-Za-z][A-Za-z0-9+.-]*://)[^\s/@'\"<>`]+:[^\s/@'\"<>`]*@(?=[\w\[])"
)
_SECRET_PARAM = re.compile(
    r"([?&#;][^=\s&#?]*(?:key|token|secret|pass|pwd|auth|sig|credential|session|cookie)[^=\s&#?]*=)(?!\*\*\*)[^\s&#'\"<>`]*[^\s&#'\"<>`.,:;)\]}]",
    re.I,
)
_BEARER = re.compile(r"(Bearer\s+)[A-Za-z0-9._~+/=-]+", re.I)


def redact_url(url: str) -> str:
    """The URL with userinfo and secret query values replaced by ***; anything else unchanged."""
    try:
        p = urlsplit(url)
        host = p.hostname or ""
        port = p.port
    except ValueError:  # not parseable (e.g. a bad port): mask everything between :// and @
        return re.sub(r"(://)[^/@]*@", rf"\g<1>{MASK}@", url)
    netloc = p.netloc
    if "@" in netloc:
        netloc = f"{MASK}@{host if ':' not in host else f'[{host}]'}" + (f":{port}" if port is not None else "")
    # the fragment too: OAuth-style `#access_token=...` (never sent, but written wherever the URL is)
    query, fragment = _redact_pairs(p.query), _redact_pairs(p.fragment)
    return urlunsplit((p.scheme, netloc, p.path, query, fragment))


def _redact_pairs(text: str) -> str:
    """`a=1&api_key=s` with secret-looking values masked; text that is not key=value pairs unchanged."""
    if not text or "=" not in text:
        return text
    pairs = parse_qsl(text, keep_blank_values=True)
    if not any(_SECRET_KEY.search(k) for k, _ in pairs):
        return text
    return urlencode([(k, MASK if _SECRET_KEY.search(k) else v) for k, v in pairs], safe="*")


def redact_text(text: str) -> str:
    """Every URL in a message redacted (and bearer tokens masked), also an endpoint written without a
    scheme (`user:pass@host:port`, which httpx is given as http://user:pass@host:port)."""
    if "://" not in text and "earer" not in text and "@" not in text and "=" not in text:
        return text
    text = _SCHEMELESS_USERINFO.sub(rf"\g<1>{MASK}@", text)
    text = _SECRET_PARAM.sub(rf"\g<1>{MASK}", text)  # `host:port/?api_key=...` without a scheme
    if "://" not in text and "earer" not in text:
        return text

    def one(m: re.Match) -> str:
        url = m.group(0)
        tail = len(url) - len(url.rstrip(".,:;)]}"))  # sentence punctuation after a URL
        return redact_url(url[: len(url) - tail]) + url[len(url) - tail :]

    return _BEARER.sub(rf"\g<1>{MASK}", _URL.sub(one, text))


def redact(obj):
    """redact_text over every string of a JSON-like structure (configs written to manifests)."""
    if isinstance(obj, str):
        return redact_text(obj)
    if isinstance(obj, dict):
        return {k: redact(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(redact(v) for v in obj)
    return obj


def endpoint_url(base: str, route: str) -> str:
    """`route` (e.g. /v1/chat/completions) under an OpenAI-compatible base URL.

    `h:p`, `http://h:p/`, `http://h:p/v1` and `http://h:p/prefix/v1/?api_key=x` all work: the
    scheme defaults to http, a trailing /v1 is not doubled, and userinfo and the query are kept."""
    base = base.strip()
    if "://" not in base:
        base = "http://" + base
    p = urlsplit(base)
    prefix = p.path.rstrip("/")
    if prefix.endswith("/v1") and route.startswith("/v1/"):
        prefix = prefix[: -len("/v1")]
    return urlunsplit((p.scheme, p.netloc, prefix + route, p.query, ""))
