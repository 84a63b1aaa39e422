"""The scale-out backend: any OpenAI-compatible `/v1/chat/completions` endpoint (SGLang, vLLM).

Conversations run concurrently (at most `concurrency` requests in flight); within one
conversation turns are sequential, each sent with the regenerated history. The server
applies the target's chat template. Requests rotate over the endpoints; a failed attempt
(connect error, timeout, HTTP 5xx/429) is retried on the next endpoint after an exponential
backoff; when the retries run out the record is rejected with the reason and the run goes on.
"""

from __future__ import annotations

import asyncio
import itertools

import httpx

from .regen import Conversation, OnDone, Sampling, TurnOutput


class EndpointError(Exception):
    def __init__(self, reason: str, detail: str):
        self.reason, self.detail = reason, detail
        super().__init__(f"{reason}: {detail}")


def base_url(endpoint: str) -> str:
    """`http://h:p`, `http://h:p/`, `http://h:p/v1` -> `http://h:p`."""
    e = endpoint.strip().rstrip("/")
    if not e.startswith(("http://", "https://")):
        e = "http://" + e
    return e[:-3] if e.endswith("/v1") else e


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
    ):
        self.endpoints = [base_url(e) for e in endpoints]
        self.sampling, self.concurrency = sampling, concurrency
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        self.model_name, self.api_key = model_name, api_key
        self._rr = itertools.cycle(range(len(self.endpoints)))
        self.retried = 0  # attempts that failed and were retried (reported in the summary)

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
                r = await client.get(f"{e}/v1/models", timeout=min(self.timeout_s, 10.0))
                data = r.json().get("data") or []
                if r.status_code == 200 and data:
                    return str(data[0]["id"])
            except (httpx.HTTPError, ValueError, KeyError, TypeError):
                continue
        return "default"

    async def _conversation(self, client, sem, conv: Conversation, on_done: OnDone) -> None:
        while not conv.done:
            try:
                async with sem:
                    out = await self._complete(client, conv.history(), conv.seed(self.sampling))
            except EndpointError as e:
                conv.fail(e.reason, f"turn {conv.turn}: {e.detail}")
                break
            conv.add(out)
        on_done(conv)

    async def _complete(self, client: httpx.AsyncClient, messages: list[dict], seed: int) -> TurnOutput:
        s = self.sampling
        body = {
            "model": self.model_name,
            "messages": messages,
            "max_tokens": s.max_new_tokens,
            "temperature": max(s.temperature, 0.0),
            "top_p": s.top_p if not s.greedy else 1.0,
            "seed": seed % (2**31),
            "stream": False,
        }
        last = ""
        for attempt in range(self.retries + 1):
            url = f"{self.endpoints[next(self._rr)]}/v1/chat/completions"
            try:
                r = await client.post(url, json=body)
            except httpx.TimeoutException as e:
                last = f"timeout after {self.timeout_s:g}s at {url} ({type(e).__name__})"
            except httpx.TransportError as e:  # connect refused, reset, DNS...
                last = f"{type(e).__name__} at {url}: {e}"
            else:
                if r.status_code == 200:
                    return self._parse(r, url)
                if r.status_code < 500 and r.status_code != 429:
                    # 4xx: the request itself is wrong (prompt too long, bad model name); retrying cannot help.
                    raise EndpointError("request_rejected", f"HTTP {r.status_code} from {url}: {r.text[:200]}")
                last = f"HTTP {r.status_code} from {url}: {r.text[:200]}"
            if attempt < self.retries:
                self.retried += 1
                await asyncio.sleep(self.backoff_s * (2**attempt))
        raise EndpointError("endpoint_error", f"{self.retries + 1} attempts failed; last: {last}")

    @staticmethod
    def _parse(r: httpx.Response, url: str) -> TurnOutput:
        try:
            data = r.json()
            choice = data["choices"][0]
            text = choice["message"]["content"] or ""
            usage = data.get("usage") or {}
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise EndpointError("bad_response", f"{url} answered without choices[0].message.content ({e})") from e
        finish = choice.get("finish_reason") or "stop"
        return TurnOutput(
            text,
            "length" if finish == "length" else "stop",
            int(usage.get("prompt_tokens") or 0),
            int(usage.get("completion_tokens") or 0),
        )
