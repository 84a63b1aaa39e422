"""The scale-out backend: any OpenAI-compatible `/v1/chat/completions` endpoint (SGLang, vLLM).

Conversations run concurrently (at most `concurrency` conversations, so as many requests, in
flight, started in plan order so shards complete in order); within one conversation turns are
sequential, each sent with the regenerated history. The server
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
import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from ..console import warn
from ..engines.engine_api import (
    EndpointError,
    EngineClient,
    Failover,
    NotAnAnswer,
    RejectedReply,
    Reply,
    chat_body,
    checked_count,
    completion_body,
    usage_count,
)
from ..model.chat import TemplateRefusal, render, split_reasoning
from ..readers.limits import UnusableReply
from .levers import cut_at_end, user_prefix
from .messages import BadRecord, tool_calls
from .regen import Conversation, OnDone, Sampling, TurnOutput

# (route, body, reply parser, what is done to the parsed turn before the conversation takes it)
Request = tuple[str, dict, Callable[[Reply], TurnOutput], Callable[[TurnOutput], TurnOutput]]

# The finish reasons of an answer the target ended (stop; tool_calls: it ended by calling a tool) or
# max_tokens cut (length). Any other (content_filter, abort, error) is a rejected turn with its reason.
ANSWER_ENDS = ("stop", "length", "tool_calls")


class OpenAIBackend:
    name = "openai"
    _warned_cut = False  # an answer cut at a template marker is said once per run

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
        self.timeout_s = timeout_s
        self.model_name, self.api_key = model_name, api_key
        self.tokenizer = tokenizer  # the target's: prompts its template refuses are rejected before a request
        self.failover = Failover(self.endpoints, retries, backoff_s)

    @property
    def retried(self) -> int:
        """Attempts that failed and were retried (reported in the summary)."""
        return self.failover.retried

    @property
    def unavailable(self) -> str | None:
        """Set when the endpoints look down (see module doc)."""
        return self.failover.unavailable

    def regenerate(self, convs: list[Conversation], on_done: OnDone) -> None:
        asyncio.run(self._run(convs, on_done))

    async def _run(self, convs: list[Conversation], on_done: OnDone) -> None:
        async with EngineClient(self.timeout_s, self.concurrency, self.api_key) as client:
            if self.model_name is None:
                self.model_name = await client.model_name(self.endpoints)
            sem = asyncio.Semaphore(self.concurrency)
            tasks = [asyncio.create_task(self._conversation(client, sem, c, on_done)) for c in convs]
            try:
                await asyncio.gather(*tasks)
            except BaseException:
                # one conversation's error ends the run (out of file descriptors, Ctrl-C): the others stop
                # here, while the client is open, not after it closed (each would die with a traceback)
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                raise

    async def _conversation(self, client: EngineClient, sem, conv: Conversation, on_done: OnDone) -> None:
        # A conversation holds its slot for all its turns: `concurrency` conversations are in flight,
        # each with one request out. (A slot per request sent every first turn of the run before any
        # second one: no conversation finished, so nothing was journaled, until the very end.)
        async with sem:
            await self._turns(client, conv)
        on_done(conv)

    async def _turns(self, client: EngineClient, conv: Conversation) -> None:
        while not conv.done:
            request = self._user_request(conv) if conv.writes_user else self._answer_request(conv)
            if request is None:  # the template refused the conversation: it is rejected
                return
            route, body, parse, finish = request
            try:
                out = await self.failover.post(client, route, body, parse)
            except EndpointError as e:
                if e.transient:
                    conv.leave_pending(f"turn {conv.turn}: {e.detail}")
                else:
                    conv.fail(e.reason, f"turn {conv.turn}: {e.detail}")
                return
            conv.add(finish(out))

    def _answer_request(self, conv: Conversation) -> Request | None:
        """The next answer: `/v1/chat/completions` on the regenerated history (the server applies the
        template), the answer cut at any template marker it holds."""
        history = conv.history()
        if self.tokenizer is not None:
            try:  # the server would answer 400 with the same message (or render it some other way)
                render(self.tokenizer, history, True, conv.tools, conv.template_kwargs)
            except TemplateRefusal as e:
                conv.fail(TemplateRefusal.reason, f"turn {conv.turn}: {e.message}")
                return None
        s = conv.sampling(self.sampling)
        body = chat_body(
            self.model_name,
            history,
            s.max_new_tokens,
            s.temperature,
            top_p=s.top_p if not s.greedy else 1.0,
            seed=conv.seed(s),
            tools=conv.tools,
            template_kwargs=conv.template_kwargs,
        )
        return (
            "/v1/chat/completions",
            body,
            self._parse,
            lambda out: self._cut_at_markers(self._checked(out, s.max_new_tokens), conv),
        )

    def _user_request(self, conv: Conversation) -> Request | None:
        """The target writes the next user turn: `/v1/completions` on its template up to the user's
        text (token ids, so the server adds no BOS of its own), cut at the template's end-of-turn."""
        if self.tokenizer is None:
            raise RuntimeError("writing user turns needs the target's tokenizer")  # run.py always passes it
        try:
            head, marker = user_prefix(
                self.tokenizer, conv.history(), conv.template_kwargs, conv.record["meta"].get("topic")
            )
        except TemplateRefusal as e:
            conv.fail(TemplateRefusal.reason, f"turn {conv.turn}: {e.message}")
            return None
        ids = self.tokenizer(head, add_special_tokens=False).input_ids
        s = conv.sampling(self.sampling)
        body = completion_body(self.model_name, ids, s.max_new_tokens, s.temperature, top_p=s.top_p, seed=conv.seed(s))
        body.pop("return_token_ids", None)  # the text is what is kept
        return (
            "/v1/completions",
            body,
            self._parse_completion,
            lambda out: dataclasses.replace(self._checked(out, s.max_new_tokens), text=cut_at_end(out.text, marker)),
        )

    def _checked(self, out: TurnOutput, max_tokens: int) -> TurnOutput:
        """The server's completion count, checked (`checked_count`): out of 0..max_tokens or not an
        integer, the answer is counted with the target's tokenizer; the turn records that it was."""
        tok = self.tokenizer
        c = checked_count(
            out.completion_tokens,
            max_tokens,
            lambda: len(tok(out.text, add_special_tokens=False).input_ids) if tok is not None else None,
        )
        return dataclasses.replace(out, completion_tokens=c.n, recounted=c.why)

    @functools.cached_property
    def markers(self) -> tuple[str, ...]:
        """The template's own special tokens as text (end of turn, role headers: `<|im_end|>`,
        `<|im_start|>`, `<|eot_id|>`...) and the EOS: none of them belongs inside an answer."""
        tok = self.tokenizer
        if tok is None:
            return ()
        template = getattr(tok, "chat_template", None) or ""
        specials = set(getattr(tok, "all_special_tokens", None) or ())
        specials |= {t.content for t in (getattr(tok, "added_tokens_decoder", None) or {}).values() if t.special}
        eos = getattr(tok, "eos_token", None)
        return tuple(sorted((t for t in specials if t and (t in template or t == eos)), key=len, reverse=True))

    def _cut_at_markers(self, out: TurnOutput, conv: Conversation) -> TurnOutput:
        """An answer holding the template's end-of-turn or a role marker is cut there, not rejected and
        not kept whole. Kept whole, a fake `<|im_start|>user` turn would be trained as assistant text;
        the text before the marker is what the target wrote before ending its turn (the server did not
        stop at that token: its stop tokens are not the template's), so it is the answer the target
        gives, and a seeded rerun would return the same reply, so a reject would lose it for good. The
        cut turn ends as `stop`; an answer that is nothing but the marker is then an empty_generation."""
        hits = [i for i in (out.text.find(m) for m in self.markers) if i >= 0]
        if not hits:
            return out
        cut = min(hits)
        if not self._warned_cut:
            self._warned_cut = True
            warn(
                f"record {conv.record['id']}: the answer holds the chat template's own marker "
                f"({out.text[cut : cut + 24]!r}); answers are cut there (the server does not stop at the template's "
                "end-of-turn token: check its stop tokens / generation_config)"
            )
        return dataclasses.replace(out, text=out.text[:cut], finish_reason="stop")

    @staticmethod
    def _parse_completion(r: Reply) -> TurnOutput:
        try:
            data = r.json()
            choice = data["choices"][0]
            text = choice["text"]
            if not isinstance(text, str):
                raise TypeError(f"text is {type(text).__name__}")
            usage = data.get("usage")
            usage = usage if isinstance(usage, dict) else {}
            prompt_tokens = usage_count(usage.get("prompt_tokens"))
            completion_tokens: Any = usage.get("completion_tokens")  # checked in _checked, against max_tokens
        except UnusableReply:
            raise
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
            raise ValueError(f"{type(e).__name__}: {str(e)[:100]}") from e
        # a written prompt the engine ended for any reason but its end-of-turn (length, content_filter...)
        # is not one the target finished: it is dropped as cut (synth_cut)
        finish = choice.get("finish_reason") or "stop"
        return TurnOutput(text, "stop" if finish == "stop" else "length", prompt_tokens, completion_tokens)

    @staticmethod
    def _parse(r: Reply) -> TurnOutput:
        try:
            data = r.json()
            if not isinstance(data, dict) or not isinstance(data.get("choices"), list) or not data["choices"]:
                # JSON, but no answer (an error object sent with 200): every request gets it, stop the run
                raise NotAnAnswer("no choices")
            choice = data["choices"][0]
            msg = choice["message"]
            text = msg["content"] or ""
            usage = data.get("usage")
            usage = usage if isinstance(usage, dict) else {}
            if not isinstance(text, str):
                raise TypeError(f"content is {type(text).__name__}")
            # counts that are not numbers ("n/a") are ignored: they made a good answer pending forever
            prompt_tokens = usage_count(usage.get("prompt_tokens"))
            completion_tokens: Any = usage.get("completion_tokens")  # checked in _checked, against max_tokens
            calls = tool_calls(msg["tool_calls"], "response") if msg.get("tool_calls") else None
        except UnusableReply:
            raise
        except (RecursionError, OverflowError) as e:  # tool-call arguments nested deep, a count of 1e400...
            raise UnusableReply(f"a reply this backend cannot use ({type(e).__name__}: {str(e)[:100]})") from e
        except (ValueError, KeyError, IndexError, TypeError, AttributeError, BadRecord) as e:
            raise ValueError(f"{type(e).__name__}: {str(e)[:100]}") from e
        # a server with a reasoning parser returns the thinking apart (vLLM: `reasoning` or
        # `reasoning_content`); without one it stays inline in the content
        reasoning = next((msg[k] for k in ("reasoning_content", "reasoning") if isinstance(msg.get(k), str)), None)
        if not reasoning:
            reasoning, text = split_reasoning(text)
        finish = choice.get("finish_reason") or "stop"
        if finish not in ANSWER_ENDS:  # content_filter, abort...: the text is not the target's whole answer
            raise RejectedReply(
                "finish_reason", f"the server ended the answer with finish_reason {str(finish)[:40]!r}, not stop/length"
            )
        model = data.get("model")
        return TurnOutput(
            text,
            "length" if finish == "length" else "stop",
            prompt_tokens,
            completion_tokens,
            reasoning or None,
            calls,
            model=model[:200] if isinstance(model, str) and model else None,
        )
