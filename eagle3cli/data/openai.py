"""The scale-out backend: any OpenAI-compatible `/v1/chat/completions` endpoint (SGLang, vLLM).

Conversations run concurrently (at most `concurrency` requests in flight); within one
conversation turns are sequential, each sent with the regenerated history. The server
applies the target's chat template. Requests rotate over the endpoints.

Failures are of two kinds, and only one of them loses a record:
* transient (connect error, timeout, HTTP 5xx/429 or any other status that says nothing about
  the request, a 200 whose body is not a chat completion): retried on the next endpoint after an
  exponential backoff; when the retries run out the conversation is left *pending*, not
  rejected: nothing is journaled for it and a rerun regenerates it (seeded, so identically);
* content-level (HTTP 400/413/422: the prompt is too long, the request is malformed): the record
  is rejected with the reason and the run goes on.
When a request runs out of retries and no request succeeded meanwhile, the endpoints are taken
to be down: conversations not started yet are left pending at once instead of each waiting
through its own retries (a dead server ends the run in seconds, with everything pending).
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import json
import os
import time
from typing import Any

import httpx

from ..model.chat import TemplateRefusal, render, split_reasoning
from ..urls import endpoint_url, redact_text
from .messages import BadRecord, tool_calls
from .regen import Conversation, OnDone, Sampling, TurnOutput

# Statuses that blame the request itself: retrying the same request cannot help.
CONTENT_STATUSES = (400, 413, 422)


class EndpointError(Exception):
    def __init__(self, reason: str, detail: str, transient: bool = True):
        self.reason, self.detail, self.transient = reason, redact_text(detail), transient
        super().__init__(f"{reason}: {self.detail}")


class OpenAIBackend:
    name = "openai"

    def __init__(
        self,
        endpoints: list[str],
        sampling: Sampling,
        concurrency: int = 16,
        timeout_s: float = 120.0,
        retries: int = 4,
        backoff_s: float = 0.5,
        model_name: str | None = None,
        api_key: str | None = None,
        tokenizer=None,
    ):
        self.endpoints = list(endpoints)
        self.sampling, self.concurrency = sampling, concurrency
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        self.model_name, self.api_key = model_name, api_key
        self.tokenizer = tokenizer  # the target's: prompts its template refuses are rejected before a request
        self._rr = itertools.cycle(range(len(self.endpoints)))
        self.retried = 0  # attempts that failed and were retried (reported in the summary)
        self.unavailable: str | None = None  # set when the endpoints look down (see module doc)
        self._last_success = float("-inf")

    def regenerate(self, convs: list[Conversation], on_done: OnDone) -> None:
        asyncio.run(self._run(convs, on_done))

    async def _run(self, convs: list[Conversation], on_done: OnDone) -> None:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        limits = httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency)
        async with httpx.AsyncClient(timeout=self.timeout_s, headers=headers, limits=limits) as client:
            if self.model_name is None:
                self.model_name = await self._discover_model(client)
            sem = asyncio.Semaphore(self.concurrency)
            await asyncio.gather(*(self._conversation(client, sem, c, on_done) for c in convs))

    async def _discover_model(self, client: httpx.AsyncClient) -> str:
        """vLLM checks the model name; SGLang accepts any. Ask the first endpoint that answers."""
        for e in self.endpoints:
            try:
                r = await client.get(endpoint_url(e, "/v1/models"), timeout=min(self.timeout_s, 10.0))
                data = r.json().get("data") or []
                if r.status_code == 200 and data:
                    return str(data[0]["id"])
            except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
                continue
        return "default"

    async def _conversation(self, client, sem, conv: Conversation, on_done: OnDone) -> None:
        while not conv.done:
            history = conv.history()
            if self.tokenizer is not None:
                try:  # the server would answer 400 with the same message (or render it some other way)
                    render(self.tokenizer, history, True, conv.tools, conv.template_kwargs)
                except TemplateRefusal as e:
                    conv.fail(TemplateRefusal.reason, f"turn {conv.turn}: {e.message}")
                    break
            try:
                async with sem:
                    if self.unavailable is not None:
                        raise EndpointError("endpoint_error", f"not sent: {self.unavailable}")
                    out = await self._complete(
                        client, history, conv.seed(self.sampling), conv.tools, conv.template_kwargs
                    )
            except EndpointError as e:
                if e.transient:
                    conv.leave_pending(f"turn {conv.turn}: {e.detail}")
                else:
                    conv.fail(e.reason, f"turn {conv.turn}: {e.detail}")
                break
            conv.add(out)
        on_done(conv)

    async def _complete(
        self,
        client: httpx.AsyncClient,
        messages: list[dict],
        seed: int,
        tools: list | None = None,
        template_kwargs: dict | None = None,
    ) -> TurnOutput:
        s = self.sampling
        body: dict[str, Any] = {
            "model": self.model_name,
            "messages": request_messages(messages),
            "max_tokens": s.max_new_tokens,
            "temperature": max(s.temperature, 0.0),
            "top_p": s.top_p if not s.greedy else 1.0,
            "seed": seed % (2**31),
            "stream": False,
        }
        if tools:
            body["tools"] = tools
        if template_kwargs:
            # vLLM and SGLang pass these to the chat template (Qwen3's enable_thinking); gpt-oss
            # servers also read reasoning_effort as a request field
            body["chat_template_kwargs"] = dict(template_kwargs)
            if "reasoning_effort" in template_kwargs:
                body["reasoning_effort"] = template_kwargs["reasoning_effort"]
        started, last = time.monotonic(), ""
        for attempt in range(self.retries + 1):
            url = endpoint_url(self.endpoints[next(self._rr)], "/v1/chat/completions")
            shown = redact_text(url)
            try:
                r = await client.post(url, json=body)
            except httpx.TimeoutException as e:
                last = f"timeout after {self.timeout_s:g}s at {shown} ({type(e).__name__})"
            except httpx.TransportError as e:  # connect refused, reset, DNS...
                local = _local_limit(e)
                if local is not None:  # our process ran out of descriptors: not the endpoint's fault
                    raise local from e
                last = f"{type(e).__name__} at {shown}: {e}"
            else:
                if r.status_code == 200:
                    try:
                        out = self._parse(r)
                    except ValueError as e:  # a proxy's HTML page, a cut body: the next try may be fine
                        last = f"{shown} answered 200 without choices[0].message.content ({e})"
                    else:
                        self._last_success = time.monotonic()
                        return out
                elif r.status_code in CONTENT_STATUSES:
                    raise EndpointError(
                        "request_rejected", f"HTTP {r.status_code} from {shown}: {r.text[:200]}", transient=False
                    )
                else:
                    last = f"HTTP {r.status_code} from {shown}: {r.text[:200]}"
            if attempt < self.retries and self.unavailable is None:
                self.retried += 1
                await asyncio.sleep(self.backoff_s * (2**attempt))
            elif self.unavailable is not None:
                break
        if self._last_success < started and self.unavailable is None:
            self.unavailable = f"no endpoint answered; last: {redact_text(last)}"
        raise EndpointError("endpoint_error", f"{attempt + 1} attempt(s) failed; last: {last}")

    @staticmethod
    def _parse(r: httpx.Response) -> TurnOutput:
        try:
            data = r.json()
            choice = data["choices"][0]
            msg = choice["message"]
            text = msg["content"] or ""
            usage = data.get("usage") or {}
            if not isinstance(text, str):
                raise TypeError(f"content is {type(text).__name__}")
            prompt_tokens = int(usage.get("prompt_tokens") or 0)
            completion_tokens = int(usage.get("completion_tokens") or 0)
            calls = tool_calls(msg["tool_calls"], "response") if msg.get("tool_calls") else None
        except (ValueError, KeyError, IndexError, TypeError, AttributeError, BadRecord) as e:
            raise ValueError(f"{type(e).__name__}: {str(e)[:100]}") from e
        # a server with a reasoning parser returns the thinking apart (vLLM: `reasoning` or
        # `reasoning_content`); without one it stays inline in the content
        reasoning = next((msg[k] for k in ("reasoning_content", "reasoning") if isinstance(msg.get(k), str)), None)
        if not reasoning:
            reasoning, text = split_reasoning(text)
        finish = choice.get("finish_reason") or "stop"
        return TurnOutput(
            text,
            "length" if finish == "length" else "stop",
            prompt_tokens,
            completion_tokens,
            reasoning or None,
            calls,
        )


def _local_limit(e: BaseException) -> OSError | None:
    """The OSError behind a transport error when it is this machine's limit on open files (EMFILE,
    ENFILE), which a retry or another endpoint cannot fix."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (errno.EMFILE, errno.ENFILE):
            return OSError(e.errno, os.strerror(e.errno))
        e = e.__cause__ or e.__context__  # type: ignore[assignment]
    return None


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
