"""Every HTTP request eagle3 sends to a serving engine (SGLang, vLLM, the stand-in server).

gen-data's openai backend, `eval --endpoint`, `serve-bench` and `serve`'s health wait all talk
through this module: the request bodies (OpenAI chat and completions, SGLang's `/generate`),
one async client with `/health`, `/v1/models`, `/server_info` and the Prometheus `/metrics`
scrape, and the retry policy with exponential backoff over several endpoints. What a stage
makes of an answer (a regenerated turn, an accept length) stays with the stage.

httpx, not the `openai` SDK: the SDK covers only the OpenAI routes (no `/generate`, `/health`
or `/metrics`), and its built-in retries would hide the attempts gen-data counts and the
difference between "the server is down" (retry later) and "the request is bad" (reject it).
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import json
import os
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from ..errors import UsageError
from ..readers.limits import BODY_ENV, UnusableReply, max_body_bytes, strict_json
from ..urls import endpoint_url, redact_text

T = TypeVar("T")

# Statuses that blame the request itself: retrying the same request cannot help.
CONTENT_STATUSES = (400, 413, 422)
# Statuses that blame the run's settings: no such model at that endpoint (a wrong --served-model-name,
# 404), a missing or wrong key (401/403). Every request would get the same, today and on a rerun, so
# the run stops with the server's words (exit 2) instead of leaving everything pending (exit 3).
PERMANENT_STATUSES = (401, 403, 404)
# How long an endpoint that did not answer at all is passed over while another one serves.
DOWN_S = 30.0
# The reject reason of a request whose answer we refuse to use (too big, too deep, NaN/Infinity).
UNUSABLE = "unusable_response"


# ---------------------------------------------------------------- request bodies
def request_messages(messages: list[dict]) -> list[dict]:
    """Our messages in the OpenAI request form: tool-call arguments as JSON text, call ids present."""
    out = []
    for k, m in enumerate(messages):
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [
                {
                    "id": c.get("id") or f"call_{k}_{j}",
                    "type": "function",
                    "function": {
                        "name": c["function"]["name"],
                        "arguments": c["function"]["arguments"]
                        if isinstance(c["function"]["arguments"], str)
                        else json.dumps(c["function"]["arguments"], ensure_ascii=False),
                    },
                }
                for j, c in enumerate(m["tool_calls"])
            ]
        out.append(m)
    return out


def chat_body(
    model: str | None,
    messages: list[dict],
    max_tokens: int,
    temperature: float = 0.0,
    *,
    top_p: float | None = None,
    seed: int | None = None,
    tools: list | None = None,
    template_kwargs: dict | None = None,
    extra: dict | None = None,
) -> dict:
    """`POST /v1/chat/completions`: the server applies the target's chat template."""
    body: dict[str, Any] = {"model": model, "messages": request_messages(messages), "max_tokens": max_tokens}
    body["temperature"] = max(temperature, 0.0)
    if top_p is not None:
        body["top_p"] = top_p
    if seed is not None:
        body["seed"] = seed % (2**31)
    body["stream"] = False
    if tools:
        body["tools"] = tools
    if template_kwargs:
        # vLLM and SGLang pass these to the chat template (Qwen3's enable_thinking); gpt-oss
        # servers also read reasoning_effort as a request field
        body["chat_template_kwargs"] = dict(template_kwargs)
        if "reasoning_effort" in template_kwargs:
            body["reasoning_effort"] = template_kwargs["reasoning_effort"]
    return {**body, **(extra or {})}


def generate_body(prompt_ids: list[int], sampling_params: dict) -> dict:
    """SGLang's native `POST /generate` with the prompt as token ids (already chat-templated:
    sending rendered text would let the server tokenize it again and add a second BOS)."""
    return {"input_ids": list(prompt_ids), "sampling_params": sampling_params}


def hidden_states_body(prompts: list[list[int]]) -> dict:
    """SGLang's `POST /generate` for a batch of prompts' hidden states (`cache --engine sglang`): one
    greedy token each, so the answer holds every prompt position's states and nothing after them."""
    return {
        "input_ids": [list(p) for p in prompts],
        "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
        "return_hidden_states": True,
    }


def completion_body(
    model: str | None,
    prompt_ids: list[int],
    max_tokens: int,
    temperature: float = 0.0,
    *,
    top_p: float = 1.0,
    seed: int | None = None,
    ignore_eos: bool = False,
) -> dict:
    """`POST /v1/completions` with token ids as the prompt (vLLM takes a list of ints): the same
    templated ids `eagle3 eval` decodes from, so engine and eval start from identical inputs.
    `return_token_ids` asks vLLM for the generated ids, compared token for token."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": list(prompt_ids),
        "max_tokens": max_tokens,
        "temperature": max(temperature, 0.0),
        "top_p": top_p,
        "stream": False,
        "return_token_ids": True,
    }
    if seed is not None:
        body["seed"] = seed % (2**31)
    if ignore_eos:
        body["ignore_eos"] = True
    return body


# ---------------------------------------------------------------- the client
class Unreachable(Exception):
    """No HTTP answer at all: connect refused, reset, timeout."""

    def __init__(self, detail: str, timeout: bool = False):
        self.detail, self.timeout = redact_text(detail), timeout
        super().__init__(self.detail)


class BodyTooLarge(Unreachable):
    """The answer's body is larger than the body limit: the same request would get it again."""


@dataclass
class Reply:
    status: int
    text: str
    seconds: float  # request sent -> whole body received

    def json(self) -> Any:
        """The body as JSON (ValueError when it is not; UnusableReply when it nests too deep or holds
        NaN/Infinity, which no engine sends in a well-formed answer)."""
        return strict_json(self.text)


class EngineClient:
    """An async HTTP client for one or more engines (`async with EngineClient(...) as c`)."""

    def __init__(
        self, timeout_s: float = 600.0, concurrency: int = 16, api_key: str | None = None, body_limit: int | None = None
    ):
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.body_limit = body_limit  # bytes a reply may have (default: max_body_bytes(), chat-sized)
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        self.timeout_s = timeout_s
        self._http = httpx.AsyncClient(timeout=timeout_s, headers=headers, limits=limits)

    async def __aenter__(self) -> EngineClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self._http.aclose()

    async def _send(self, method: str, base: str, route: str, body: dict | None, timeout: float | None) -> Reply:
        """One request whose whole exchange (connect, send, every byte of the body) fits in the
        timeout, and whose body (after content decoding: a gzip bomb counts inflated) fits in the
        body limit: a server that drips a byte every second or streams without end cannot hold
        a stage past --timeout or fill its memory."""
        url = endpoint_url(base, route)
        shown = redact_text(url)
        budget = timeout or self.timeout_s
        limit = self.body_limit or max_body_bytes()
        t0 = time.perf_counter()
        kw: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        if method == "POST":
            kw["json"] = body

        async def exchange() -> tuple[int, str]:
            async with self._http.stream(method, url, **kw) as r:
                data = bytearray()
                async for chunk in r.aiter_bytes():
                    data += chunk
                    if len(data) > limit:
                        raise BodyTooLarge(
                            f"{shown} answered with a body over {limit} bytes (the limit on one reply; "
                            f"{BODY_ENV} raises it)"
                        )
                return r.status_code, data.decode(r.encoding or "utf-8", errors="replace")

        try:  # wait_for, not asyncio.timeout: Python 3.10 has only the former
            status, text = await asyncio.wait_for(exchange(), budget)
        except (httpx.TimeoutException, asyncio.TimeoutError, TimeoutError) as e:
            raise Unreachable(f"timeout after {budget:g}s at {shown} ({type(e).__name__}, whole request)", True) from e
        except httpx.HTTPError as e:  # connect refused, reset, DNS, a body that cannot be decoded...
            local = _local_limit(e)
            if local is not None:  # our process ran out of descriptors: not the endpoint's fault
                raise local from e
            raise Unreachable(f"{type(e).__name__} at {shown}: {e}") from e
        return Reply(status, text, time.perf_counter() - t0)

    async def post(self, base: str, route: str, body: dict, timeout: float | None = None) -> Reply:
        return await self._send("POST", base, route, body, timeout)

    async def get(self, base: str, route: str, timeout: float | None = None) -> Reply:
        return await self._send("GET", base, route, None, timeout)

    async def get_json(self, base: str, route: str, timeout: float | None = None) -> Any:
        """The JSON of a 200 answer, else None (unreachable, another status, not JSON)."""
        try:
            r = await self.get(base, route, timeout)
            return r.json() if r.status == 200 else None
        except (Unreachable, ValueError):
            return None

    async def health(self, base: str) -> str | None:
        """None when `/health` answers 200, else why not."""
        try:
            r = await self.get(base, "/health", timeout=10.0)
        except Unreachable as e:
            return e.detail
        return None if r.status == 200 else f"HTTP {r.status}"

    async def model_name(self, bases: list[str], default: str = "default") -> str:
        """The served model's name from `/v1/models` (vLLM checks it; SGLang accepts any)."""
        for base in bases:
            data = await self.get_json(base, "/v1/models", timeout=min(self.timeout_s, 10.0))
            try:
                return str(data["data"][0]["id"])
            except (KeyError, IndexError, TypeError):
                continue
        return default

    async def server_accept_length(self, base: str) -> float | None:
        """SGLang's running average over recent batches (`internal_states[*].avg_spec_accept_length`)."""
        for route in ("/server_info", "/get_server_info"):
            info = await self.get_json(base, route)
            if not isinstance(info, dict):
                continue
            states = info.get("internal_states") or [info]
            found = [s.get("avg_spec_accept_length") for s in states if isinstance(s, dict)]
            vals = [float(v) for v in found if isinstance(v, (int, float))]
            if vals:
                return sum(vals) / len(vals)
        return None

    async def is_vllm(self, base: str) -> bool:
        """vLLM answers `/metrics` with its `vllm:` counters (SGLang and the stand-in do not)."""
        try:
            r = await self.get(base, "/metrics", timeout=10.0)
        except Unreachable:
            return False
        return r.status == 200 and "vllm:" in r.text

    async def spec_counters(self, base: str) -> SpecCounters | None:
        """vLLM's speculative-decoding counters from `/metrics` (None: no such counters there)."""
        try:
            r = await self.get(base, "/metrics", timeout=10.0)
        except Unreachable:
            return None
        return spec_counters(r.text) if r.status == 200 else None


def _local_limit(e: BaseException) -> OSError | None:
    """The OSError behind a transport error when it is this machine's limit on open files (EMFILE,
    ENFILE), which a retry or another endpoint cannot fix (the CLI names the limit and exits 2)."""
    seen = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.errno in (errno.EMFILE, errno.ENFILE):
            return OSError(cur.errno, os.strerror(cur.errno))
        cur = cur.__cause__ or cur.__context__
    return None


def is_healthy(url: str, timeout_s: float = 2.0) -> bool:
    """One synchronous `/health`-style poll (the launcher waits in a plain loop, not an event loop)."""
    try:
        return httpx.get(url, timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


# ---------------------------------------------------------------- retries over endpoints
class RejectedReply(Exception):
    """A well-formed answer this request will always get (seeded), that is no usable turn: a finish
    reason such as `content_filter` or `abort`. The record is rejected with `reason`."""

    def __init__(self, reason: str, detail: str):
        self.reason, self.detail = reason, detail
        super().__init__(f"{reason}: {detail}")


class NotAnAnswer(Exception):
    """A 200 whose JSON is not an answer of the route at all (no `choices`: an error object sent with
    status 200). The server says the same to every request: the run stops (exit 2) with its words."""


class EndpointRefused(UsageError):
    """The endpoint refuses every request of this run (PERMANENT_STATUSES, NotAnAnswer): exit 2."""


def usage_count(v: Any) -> int:
    """A token count from a reply's `usage`; one that is not a finite number is ignored (0), never
    fatal: the answer is what the run keeps, the counts only feed the summary."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v == v or v in (float("inf"), float("-inf")):
        return 0
    return max(0, int(v))


@dataclass(frozen=True)
class TokenCount:
    """A completion's token count: the server's (`server`), what came back counted again because the
    server's number cannot be (`recounted`, `why` says what it said), or nothing to count from (`refused`)."""

    n: int
    source: str  # "server" | "recounted" | "refused"
    why: str | None = None


def checked_count(reported: Any, max_tokens: int | None, recount: Callable[[], int | None]) -> TokenCount:
    """The one rule for a completion-token count a server reports: an integer from 0 to the request's
    max_tokens is the server's; anything else (10**9 for a 4-token answer, -40, 3.5, "n/a", missing) is
    recounted from what came back (its token ids, or its text through the target's tokenizer:
    `recount`, None when there is nothing to count with) and said to be. Throughput and tau are
    divided by these counts: a server's word alone made serve-bench report 1.5e10 tok/s."""
    integral = isinstance(reported, int) and not isinstance(reported, bool)
    if integral and 0 <= reported and (max_tokens is None or reported <= max_tokens):
        return TokenCount(reported, "server")
    shown = repr(reported)[:40] if reported is not None else "no"
    why = f"the server reported {shown} completion tokens" + (
        f" (max_tokens {max_tokens})" if integral and max_tokens is not None and reported > max_tokens else ""
    )
    n = recount()
    return TokenCount(n, "recounted", why) if n is not None else TokenCount(0, "refused", why)


class EndpointError(Exception):
    def __init__(self, reason: str, detail: str, transient: bool = True):
        self.reason, self.detail, self.transient = reason, redact_text(detail), transient
        super().__init__(f"{reason}: {self.detail}")


class Failover:
    """One request retried with exponential backoff, rotating over the endpoints.

    Transient failures (no answer, a timeout, 5xx/429 or any status that says nothing about the
    request, a 200 that `parse` refuses) are retried; 400/413/422 blame the request and are not.
    When a request runs out of retries and no request succeeded meanwhile, the endpoints are
    taken to be down (`unavailable`): later requests fail at once instead of each waiting
    through its own retries."""

    def __init__(self, endpoints: list[str], retries: int = 4, backoff_s: float = 0.5):
        self.endpoints, self.retries, self.backoff_s = list(endpoints), retries, backoff_s
        self._rr = itertools.cycle(range(len(self.endpoints)))
        self.retried = 0  # attempts that failed and were retried
        self.unavailable: str | None = None
        self._last_success = float("-inf")
        self._down_until: dict[int, float] = {}  # endpoint -> until when it is passed over (no answer)

    def _pick(self, first: int, attempt: int) -> int:
        """The endpoint of a request's attempt: its own rotation from `first` (one shared cycle handed
        concurrent requests' retries out in lockstep, so some requests met only a dead endpoint on
        every try), over the endpoints not marked down, or all of them when every one is."""
        now = time.monotonic()
        order = [(first + i) % len(self.endpoints) for i in range(len(self.endpoints))]
        up = [i for i in order if self._down_until.get(i, 0.0) <= now] or order
        return up[attempt % len(up)]

    def _refused(self, shown: str, what: str, text: str) -> EndpointRefused:
        return EndpointRefused(
            f"{shown} {what}; the server said: {redact_text(text[:300]) or '(nothing)'}",
            "an endpoint that serves this model to this client (every request would get the same answer)",
            "check --endpoint, --served-model-name (curl ENDPOINT/v1/models lists the served names) and "
            "OPENAI_API_KEY, then rerun the same command (finished conversations are kept)",
        )

    async def post(self, client: EngineClient, route: str, body: dict, parse: Callable[[Reply], T]) -> T:
        if self.unavailable is not None:
            raise EndpointError("endpoint_error", f"not sent: {self.unavailable}")
        started, last, attempt = time.monotonic(), "", 0
        first = next(self._rr)
        for attempt in range(self.retries + 1):
            i = self._pick(first, attempt)
            base = self.endpoints[i]
            shown = redact_text(endpoint_url(base, route))
            try:
                r = await client.post(base, route, body)
            except BodyTooLarge as e:  # the same request gets the same endless body: reject it
                raise EndpointError(UNUSABLE, e.detail, transient=False) from e
            except Unreachable as e:
                last = e.detail
                if not e.timeout:  # no answer at all: pass it over while another one serves
                    self._down_until[i] = time.monotonic() + DOWN_S
            else:
                self._down_until.pop(i, None)
                if r.status == 200:
                    try:
                        out = parse(r)
                    except UnusableReply as e:  # valid HTTP, hostile JSON: this request's answer, not an outage
                        raise EndpointError(UNUSABLE, f"{shown} answered 200 with {e}", transient=False) from e
                    except RejectedReply as e:  # a seeded request gets the same answer again: reject the record
                        raise EndpointError(e.reason, f"{shown}: {e.detail}", transient=False) from e
                    except NotAnAnswer as e:
                        raise self._refused(shown, f"answered 200 with no answer in it ({e})", r.text) from e
                    except ValueError as e:  # a proxy's HTML page, a cut body: the next try may be fine
                        last = f"{shown} answered 200 without choices[0].message.content ({e})"
                    else:
                        self._last_success = time.monotonic()
                        return out
                elif r.status in CONTENT_STATUSES:
                    detail = f"HTTP {r.status} from {shown}: {r.text[:200]}"
                    raise EndpointError("request_rejected", detail, transient=False)
                elif r.status in PERMANENT_STATUSES:
                    raise self._refused(shown, f"answered HTTP {r.status} (model {body.get('model')!r})", r.text)
                else:
                    last = f"HTTP {r.status} from {shown}: {r.text[:200]}"
            if attempt < self.retries and self.unavailable is None:
                self.retried += 1
                await asyncio.sleep(self.backoff_s * (2**attempt))
            elif self.unavailable is not None:
                break
        if self._last_success < started and self.unavailable is None:
            self.unavailable = f"no endpoint answered; last: {redact_text(last)}"
        raise EndpointError("endpoint_error", f"{attempt + 1} attempt(s) failed; last: {last}")


def run_sync(
    make: Callable[[EngineClient], Awaitable[T]], timeout_s: float = 600.0, body_limit: int | None = None
) -> T:
    """`make(client)` on a fresh client, from synchronous code (eval's sequential requests)."""

    async def main() -> T:
        async with EngineClient(timeout_s=timeout_s, concurrency=1, body_limit=body_limit) as c:
            return await make(c)

    return asyncio.run(main())


# ---------------------------------------------------------------- Prometheus /metrics
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')
SPEC_PREFIX = "vllm:spec_decode_"


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample in Prometheus' text format; comments skipped."""
    out = []
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if not m or line.startswith("#"):
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out.append((m.group(1), dict(_LABEL.findall(m.group(2) or "")), value))
    return out


@dataclass(frozen=True)
class SpecCounters:
    """vLLM's cumulative spec-decode counters (summed over its engines and models)."""

    drafts: float  # verification rounds that carried a draft
    draft_tokens: float
    accepted: float
    per_pos: tuple[float, ...]  # accepted at draft position 0, 1, ... (a chain: all before it too)

    def minus(self, before: SpecCounters) -> SpecCounters:
        """The counts of the requests between two scrapes."""
        n = max(len(self.per_pos), len(before.per_pos))
        pad = lambda p: tuple(p) + (0.0,) * (n - len(p))  # noqa: E731
        per = tuple(a - b for a, b in zip(pad(self.per_pos), pad(before.per_pos)))
        return SpecCounters(
            self.drafts - before.drafts, self.draft_tokens - before.draft_tokens, self.accepted - before.accepted, per
        )

    @property
    def tau(self) -> float | None:
        """Tokens per verification pass: 1 + accepted / drafts (the bonus token included)."""
        from ..speculate.acceptance import tau_from_counts  # lazy: the wing imports torch

        return tau_from_counts(self.accepted, self.drafts)

    def per_position(self) -> list[float]:
        """P(draft token k accepted) over rounds, k = 1..K: eval's chain `unconditional` acceptance."""
        from ..speculate.acceptance import unconditional_from_counts

        return unconditional_from_counts(self.per_pos, self.drafts)


def spec_counters(metrics_text: str) -> SpecCounters | None:
    """The spec-decode counters in a `/metrics` page, or None when the page has none."""
    totals: dict[str, float] = {}
    per: dict[int, float] = {}
    found = False
    for name, labels, value in parse_prometheus(metrics_text):
        if not name.startswith(SPEC_PREFIX) or not name.endswith("_total"):
            continue
        found = True
        key = name[len(SPEC_PREFIX) : -len("_total")]
        if key == "num_accepted_tokens_per_pos":
            pos = int(labels.get("position", "0"))
            per[pos] = per.get(pos, 0.0) + value
        else:
            totals[key] = totals.get(key, 0.0) + value
    if not found:
        return None
    return SpecCounters(
        totals.get("num_drafts", 0.0),
        totals.get("num_draft_tokens", 0.0),
        totals.get("num_accepted_tokens", 0.0),
        tuple(per.get(i, 0.0) for i in range(max(per) + 1)) if per else (),
    )
