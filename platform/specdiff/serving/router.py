"""The ingress logic: OpenAI requests -> the engine's decode loop over the drafter and verifier handles, or (a
colocated app: ``info()["colocated"]``) whole decodes streamed from the replica that holds both models.

``OpenAIRouter`` is a plain class (handles and tokenizer injected); ``app.Router`` wraps it in FastAPI + Serve.
Each decode loop runs in a worker thread because the engine is synchronous and calls handles with ``.result()``;
chunks come back to the event loop through a queue. A client that goes away (the request task is cancelled) stops
its loop after the current round and frees its verifier session.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import AsyncIterator, Callable

from specdiff.core.config import DecodeOptions, SamplingParams, SpecConfig
from specdiff.core.engine import DecodeStream, SpeculativeDecoder, stream_plain
from specdiff.core.policy import SpeculationCosts
from specdiff.core.stats import DecodeStats
from specdiff.core.text import TextStreamer
from specdiff.serving.config import ModelSource, RouterOptions
from specdiff.serving.metrics import NullMetrics
from specdiff.serving.models import load_tokenizer, stop_token_ids
from specdiff.serving.protocol import ApiError, ChatRequest, CompletionRequest, parse, value_error
from specdiff.serving.aio import iterate_in_thread
from specdiff.serving.remote import RemoteDrafter, RemoteVerifier, remote_decode
from specdiff.serving.wire import room_error, room_needed

logger = logging.getLogger(__name__)


def spec_usage(stats: DecodeStats, prompt_tokens: int, completion_tokens: int, speculative: bool) -> dict:
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}
    usage["total_tokens"] = prompt_tokens + completion_tokens
    usage["speculative"] = {
        "enabled": speculative,
        "tau": round(stats.tau, 4),
        "alpha": [round(a, 4) for a in stats.alpha],
        "accepted_per_position": stats.accepted_per_position,
        "reached_per_position": stats.reached_per_position,
        "rounds": stats.rounds,
        "verifier_calls": stats.verifier_calls,
        "drafted": stats.drafted,
        "accepted": stats.accepted,
        "fallbacks": stats.fallbacks,
        "drafter_s": round(stats.drafter_s, 6),
        "verifier_s": round(stats.verifier_s, 6),
        "prefill_s": round(stats.prefill_s, 6),
        "choices": stats.choices,  # plain steps and the windows / K the rounds ran (the adaptive policy's picks)
    }
    return usage


class OpenAIRouter:
    def __init__(self, drafter_handle, verifier_handle, models: ModelSource, options: RouterOptions, *, metrics=None):
        self.models = models
        self.options = options
        self.metrics = metrics or NullMetrics()
        self.tokenizer = load_tokenizer(models)
        self.drafter_handle = drafter_handle
        self.verifier_handle = verifier_handle
        self.pool = ThreadPoolExecutor(options.decode_threads, thread_name_prefix="decode")
        self._info: dict | None = None
        self._drafter: RemoteDrafter | None = None
        # The adaptive policy's cost model (drafter call, verifier call per trie size), as served: round trips
        # included. Measured by the first adaptive decode, then shared by this router's requests.
        self.costs: SpeculationCosts | None = None

    async def info(self) -> dict:
        """vocab size / context, asked of the verifier once (the router does not load model weights)."""
        if self._info is None:
            info = await self.verifier_handle.info.remote()
            if info.get("colocated"):  # one deployment holds both models and runs whole decodes
                self._info = info
                return info
            drafter = await self.drafter_handle.info.remote()
            self._drafter = RemoteDrafter(
                self.drafter_handle,
                drafter["vocab_size"],
                timeout_s=self.options.drafter_timeout_s,
                cooldown_s=self.options.drafter_cooldown_s,
                metrics=self.metrics,
                tap_layers=drafter.get("tap_layers"),
            )
            self._info = info
        return self._info

    def model_list(self) -> dict:
        entry = {"id": self.models.model_id, "object": "model", "created": 0, "owned_by": "specdiff"}
        return {"object": "list", "data": [entry]}

    # -- request handling -------------------------------------------------------------------------------------------

    async def completions(self, body: bytes):
        req = parse(CompletionRequest, body)
        if isinstance(req.prompt, str):
            if not req.prompt:
                raise ApiError("prompt must not be empty", param="prompt")
            prompt_ids = self.tokenizer.encode(req.prompt, add_special_tokens=False)
        else:
            prompt_ids = req.prompt
        return await self._generate(req, prompt_ids, "prompt", chat=False)

    async def chat(self, body: bytes):
        req = parse(ChatRequest, body)
        messages = [{"role": m.role, "content": m.text()} for m in req.messages]
        if not any(m["content"] for m in messages):
            raise ApiError("messages must contain some text", param="messages")
        prompt_ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(prompt_ids, dict) or hasattr(prompt_ids, "input_ids"):
            prompt_ids = prompt_ids["input_ids"]
        return await self._generate(req, list(prompt_ids), "messages", chat=True)

    def _configs(self, req) -> tuple[SamplingParams, SpecConfig | None, int]:
        opts = self.options
        if req.model != self.models.model_id:
            raise ApiError(f"model {req.model!r} is not served here; available: [{self.models.model_id!r}]", "model")
        max_tokens = req.max_completion_tokens or req.max_tokens or opts.default_max_tokens
        if max_tokens > opts.max_tokens_limit:
            raise ApiError(f"max_tokens must be <= {opts.max_tokens_limit}, got {max_tokens}", "max_tokens")
        gamma = opts.gamma if req.gamma is None else req.gamma
        k = opts.num_candidates if req.num_candidates is None else req.num_candidates
        if gamma is not None and not 1 <= gamma <= opts.max_gamma:
            raise ApiError(f"gamma must be in [1, {opts.max_gamma}], got {gamma}", "gamma")
        if k is not None and not 1 <= k <= opts.max_candidates:
            raise ApiError(f"num_candidates must be in [1, {opts.max_candidates}], got {k}", "num_candidates")
        if any(not s for s in req.stop_strings):
            raise ApiError(f"stop must hold non-empty strings, got {req.stop!r}", "stop")
        try:
            sampling = SamplingParams(temperature=req.temperature, top_p=req.top_p, top_k=req.top_k)
            spec = SpecConfig(
                gamma=gamma,  # None (the default): the adaptive policy chooses, with the router's cost model
                num_candidates=k,
                max_gamma=min(opts.adaptive_max_gamma, opts.max_gamma),
                max_candidates=min(opts.adaptive_max_candidates, opts.max_candidates),
                draft_temperature=opts.draft_temperature if req.draft_temperature is None else req.draft_temperature,
                draft_top_k=req.draft_top_k,
                acceptance=req.acceptance,
                prompt_lookup=req.prompt_lookup,
            )
        except ValueError as err:
            raise value_error(err) from None
        return sampling, (spec if req.speculative else None), max_tokens

    async def _generate(self, req, prompt_ids: list[int], prompt_field: str, chat: bool):
        sampling, spec, max_tokens = self._configs(req)
        info = await self.info()
        if not prompt_ids:
            raise ApiError(f"{prompt_field} must not be empty", param=prompt_field)
        bad = next((t for t in prompt_ids if not 0 <= t < info["vocab_size"]), None)
        if bad is not None:
            raise ApiError(f"{prompt_field} token ids must lie in [0, {info['vocab_size']}), got {bad}", prompt_field)
        context = info["max_context"]
        if context is not None and len(prompt_ids) >= context:
            raise ApiError(
                f"{prompt_field} has {len(prompt_ids)} tokens; the model's context is {context} (room for output "
                "is needed)",
                prompt_field,
            )
        options = DecodeOptions(max_new_tokens=max_tokens, sampling=sampling, spec=spec or SpecConfig(),
                                stop_token_ids=stop_token_ids(self.tokenizer, chat), stop_strings=req.stop_strings,
                                seed=req.seed)
        if info.get("colocated"):
            message = room_error(room_needed(len(prompt_ids), options, spec is not None), info.get("kv_budget_tokens"),
                                 info.get("kv_budget_mb"), info.get("token_bytes"))
            if message is not None:  # refused before a stream starts: a plain HTTP error, not one in-band
                raise ApiError(message, param="max_tokens", status=503, kind="server_error")
            stream = remote_decode(self.verifier_handle, prompt_ids, options, speculative=spec is not None,
                                   max_load=self._max_load(req), decode=self._decode,
                                   retries=self.options.verifier_retries, metrics=self.metrics)
            return await _Run(self, stream, req, prompt_ids, chat, spec is not None).respond()
        verifier = RemoteVerifier(
            self.verifier_handle,
            info["vocab_size"],
            context,
            timeout_s=self.options.verifier_timeout_s,
            retries=self.options.verifier_retries,
            metrics=self.metrics,
            tap_layers=info.get("tap_layers"),
        )
        if spec is not None:
            # An adaptive decode takes the router's cost model, measured through the replicas by the first one.
            limit = self._max_load(req)
            decoder = SpeculativeDecoder(self._drafter, verifier, decode=self._decode, costs=self.costs,
                                         gate=None if limit is None else (lambda session: session.load <= limit))
            stream = decoder.stream(prompt_ids, options)
        else:
            decoder, stream = None, stream_plain(verifier, prompt_ids, options, decode=self._decode)

        def done():
            verifier.close()
            if decoder is not None and self.costs is None:  # the first adaptive decode measured it
                self.costs = decoder.costs

        return await _Run(self, stream, req, prompt_ids, chat, spec is not None, done).respond()

    def _max_load(self, req) -> int | None:
        """Speculation off while the session's replica decodes more than ``speculation_max_load`` sessions (under
        load, its compute is the bottleneck and a round's rejected nodes waste it); a request that names its γ or K
        runs them as given."""
        if req.gamma is not None or req.num_candidates is not None:
            return None
        return self.options.speculation_max_load

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


class _Run:
    """One request's decode: chunks from a worker thread, formatted as OpenAI JSON or SSE. ``done`` runs in that
    thread when the decode ends (frees the sessions)."""

    def __init__(self, router: OpenAIRouter, stream: DecodeStream, req, prompt_ids, chat, speculative: bool,
                 done: Callable[[], None] | None = None):
        self.router, self.stream, self.req, self.done = router, stream, req, done
        self.prompt_tokens = len(prompt_ids)
        self.chat, self.speculative = chat, speculative
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.text = TextStreamer(router._decode, req.stop_strings)
        self.endpoint = "chat" if chat else "completions"

    async def respond(self):
        if self.req.stream:
            return self.sse()
        return await self.complete()

    def _produce(self):
        """The decode's chunks (blocking; runs in a worker thread), with the per-round metrics."""
        stats, seen, metrics = self.stream.stats, [], self.router.metrics
        try:
            for chunk in self.stream:
                if self.speculative:  # every verifier call since the last chunk (merged rounds hold several)
                    for emitted, count in enumerate(stats.calls_by_emitted):
                        for _ in range(count - (seen[emitted] if emitted < len(seen) else 0)):
                            metrics.acceptance_length(emitted)
                    seen = list(stats.calls_by_emitted)
                yield chunk
        finally:
            self.stream.close()
            if self.done is not None:
                self.done()

    def chunks(self) -> AsyncIterator[list[int]]:
        # chunks that queue up while the client's stream is busy go on as one (a longer delta, the same text)
        return iterate_in_thread(self._produce(), self.router.pool, merge=lambda a, b: a + b)

    def _finish_reason(self) -> str:
        return "stop" if self.stream.finish_reason == "stop" else "length"

    def _usage(self) -> dict:
        return spec_usage(self.stream.stats, self.prompt_tokens, len(self.stream.tokens), self.speculative)

    def _record(self, status: str) -> None:
        stats = self.stream.stats if status == "ok" else None
        self.router.metrics.request(self.endpoint, status, stats, self.speculative)

    async def complete(self) -> dict:
        try:
            async for chunk in self.chunks():
                self.text.push(chunk)
        except asyncio.CancelledError:
            self.router.metrics.disconnect()
            self._record("disconnected")
            raise
        except Exception:
            self._record("error")
            raise
        self._record("ok")
        text = self._final_text()
        choice = {"index": 0, "finish_reason": self._finish_reason(), "logprobs": None}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.req.model,
            "choices": [choice],
            "usage": self._usage(),
        }

    def _final_text(self) -> str:
        streamer = TextStreamer(self.router._decode, self.req.stop_strings)
        return streamer.push(self.text.tokens, final=True)

    def _chunk(self, delta: str | None, finish_reason: str | None, first: bool = False) -> str:
        if self.chat:
            d = {"role": "assistant", "content": delta or ""} if first else ({"content": delta} if delta else {})
            choice = {"index": 0, "delta": d, "finish_reason": finish_reason, "logprobs": None}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": delta or "", "finish_reason": finish_reason, "logprobs": None}
            obj = "text_completion"
        body = {"id": self.id, "object": obj, "created": self.created, "model": self.req.model, "choices": [choice]}
        return f"data: {json.dumps(body)}\n\n"

    async def sse(self) -> AsyncIterator[str]:
        finished = False
        try:
            if self.chat:
                yield self._chunk("", None, first=True)
            async with contextlib.aclosing(self.chunks()) as chunks:
                async for chunk in chunks:
                    delta = self.text.push(chunk)
                    if delta:
                        yield self._chunk(delta, None)
            tail = self.text.push([], final=True)
            yield self._chunk(tail, self._finish_reason())
            if self.req.stream_options is not None and self.req.stream_options.include_usage:
                usage = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion"}
                usage.update(created=self.created, model=self.req.model, choices=[], usage=self._usage())
                yield f"data: {json.dumps(usage)}\n\n"
            yield "data: [DONE]\n\n"
            finished = True
            self._record("ok")
        except Exception as err:  # headers are sent already: report in-band, as OpenAI does
            logger.exception("stream failed")
            self._record("error")
            yield f"data: {json.dumps(ApiError(str(err), status=500, kind='server_error').body())}\n\n"
            finished = True
        finally:
            if not finished:  # cancelled / closed early: the client went away
                self.router.metrics.disconnect()
                self._record("disconnected")
