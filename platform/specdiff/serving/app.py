"""The Serve application: Drafter and Verifier deployments on their own pools, a FastAPI Router as ingress.

``build_app`` is the application builder behind ``serve run serve_apps.specdiff:app [key=value ...]`` and the
Serve config YAML's ``import_path`` + ``args``.

    Router (ingress, OpenAI API) --handle--> Drafter  (@serve.batch; a feature drafter's draft caches: consistent-hash
                                                       on session id; drafter_pool)
                                 --handle--> Verifier (KV-cache sessions, consistent-hash on session id, verifier_pool)

Colocated (``colocate``: true, or by default for a feature drafter): one deployment holds both models and runs whole
decodes (``Decoder``: the in-process engine, tokens streamed to the router, no call per round); the Router is the
same.

With no ``args`` it serves the embedded default pair (``models.demo=true``: the tiny random-init demo pair).
"""


import asyncio
import contextlib
import functools
import logging
import threading
import time
from typing import Any, Dict, Optional, Union

from specdiff.runtime.extras import missing_extra

try:
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from ray import serve
    from ray.serve.config import RequestRouterConfig
except ModuleNotFoundError as err:
    raise missing_extra("serve", "the Serve app (specdiff.serving.app)", err) from err

from specdiff.serving.config import AppConfig, DrafterOptions, ModelSource, RouterOptions, VerifierOptions
from specdiff.serving.metrics import ServeMetrics
from specdiff.models.sources import DEFAULT_VERIFIER, resolve_model_path, state_dir
from specdiff.serving.models import (check_pair, feature_drafter_config, load_drafter, load_pair, load_verifier, pair_label,
                     resolve_default, resolve_pair)
from specdiff.serving.protocol import ApiError
from specdiff.serving.router import OpenAIRouter
from specdiff.serving.servers import DecodeServer, DrafterServer, VerifierServer

logger = logging.getLogger(__name__)
CONSISTENT_HASH_ROUTER = "ray.serve.experimental.consistent_hash_router.ConsistentHashRouter"

CLIENT_LEFT = object()
api = FastAPI(title="specdiff", description="Speculative decoding with a masked-diffusion drafter (OpenAI API)")


class _FollowsPair:
    """Replica side of ``models.pair`` (a registry alias): every ``models.follow_s`` seconds (a daemon thread) and
    on a Serve reconfigure with ``user_config={"pair": ...}`` the alias is read again; when it names another
    drafter version, that pair is loaded and swapped in (``swap`` of the server class) without a restart. A failed
    refresh is logged and the current pair keeps serving."""

    def _follow(self, models: ModelSource, label: str | None, load) -> None:
        self._models, self._load, self.pair = models, load, label
        self._refused: str | None = None
        self._refresh_lock = threading.Lock()
        if models.pair and models.follow_s > 0:
            threading.Thread(target=self._poll, daemon=True, name="pair-follower").start()

    def reconfigure(self, user_config: dict) -> None:
        pair = (user_config or {}).get("pair")
        if pair and pair != self._models.pair:
            self._models = ModelSource.model_validate({**self._models.model_dump(), "pair": pair})
        if self._models.pair:
            self.refresh()

    def refresh(self) -> bool:
        """Swap in the pair the alias names now, if it changed; True when it did."""
        with self._refresh_lock:
            label = pair_label(self._models)
            if label in (self.pair, self._refused):  # unchanged, or refused once (another vocabulary): no reload
                return False
            previous = self.pair
            resolved, label = resolve_pair(self._models)
            try:
                self.swap(self._load(resolved), label)
            except ValueError:
                self._refused = label
                raise
            logger.info("pair follower: %s -> %s", previous, label)
            return True

    def _poll(self) -> None:
        while True:
            time.sleep(self._models.follow_s)
            try:
                self.refresh()
            except Exception:
                logger.exception("pair follower: refresh of %s failed; still serving %s", self._models.pair, self.pair)


class DrafterDeployment(_FollowsPair, DrafterServer):
    def __init__(self, models: ModelSource, options: DrafterOptions):
        resolved, label = resolve_pair(models)
        super().__init__(functools.partial(load_drafter, resolved), max_sessions=options.max_sessions,
                         cache_budget_mb=options.cache_budget_mb)
        self._follow(models, label, load_drafter)
        for method in (self.propose, self.propose_features, self.draft, self.draft_features):
            method.set_max_batch_size(options.max_batch_size)
            method.set_batch_wait_timeout_s(options.batch_wait_timeout_s)

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.004)
    async def propose(self, prefixes: list[list[int]], gammas: list[int]) -> list:
        """Called per prefix; Serve hands it the calls queued meanwhile as lists, answered by one batched forward."""
        return await asyncio.to_thread(self.propose_many, prefixes, gammas)

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.004)
    async def draft(self, prefixes: list[list[int]], specs: list, seeds: list[int]) -> list:
        """A round's drafting half per prefix: K candidates sampled here from the batched marginals."""
        return await asyncio.to_thread(self.draft_many, prefixes, specs, seeds)

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.004)
    async def draft_features(self, session_ids, anchors, ns, rows, specs, seeds) -> list:
        """Feature drafter: ``draft`` per session (routed by its id to this replica's draft cache), batched."""
        return await asyncio.to_thread(self.draft_features_many, session_ids, anchors, ns, rows, specs, seeds)

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.004)
    async def propose_features(self, session_ids, anchors, ns, gammas, rows) -> list:
        """Feature drafter: called per session (routed by its id to this replica's draft cache), batched."""
        return await asyncio.to_thread(self.propose_features_many, session_ids, anchors, ns, gammas, rows)


class VerifierDeployment(_FollowsPair, VerifierServer):
    def __init__(self, models: ModelSource, options: VerifierOptions):
        resolved, label = resolve_pair(models)
        super().__init__(
            functools.partial(load_verifier, resolved),
            max_sessions=options.max_sessions,
            kv_cache_budget_mb=options.kv_cache_budget_mb,
            feature_dtype=options.feature_dtype,
            batching=options.batching,
        )
        self._follow(models, label, load_verifier)


def _adaptive_bounds(options: RouterOptions) -> tuple[int, int] | None:
    """(max γ, max K) of the router's adaptive decodes, as ``OpenAIRouter._configs`` bounds them; None where the
    router's defaults fix both γ and K (no cost model needed)."""
    if options.gamma is not None and options.num_candidates is not None:
        return None
    return (min(options.adaptive_max_gamma, options.max_gamma),
            min(options.adaptive_max_candidates, options.max_candidates))


class DecodeDeployment(_FollowsPair, DecodeServer):
    """``colocate=true``: the verifier's pool options, both models, whole decodes (``DecodeServer.decode``)."""

    def __init__(self, models: ModelSource, options: VerifierOptions, adaptive: tuple[int, int] | None = None):
        resolved, label = resolve_pair(models)
        super().__init__(functools.partial(load_pair, resolved), max_decodes=options.max_ongoing_requests,
                         batching=options.batching, max_batch_rows=options.max_batch_rows,
                         batch_wait_s=options.batch_wait_ms / 1000, costs_cache=state_dir() / "costs",
                         kv_budget_mb=options.kv_cache_budget_mb)
        self._follow(models, label, load_pair)
        if adaptive is not None:  # the cost model before the first request: (the router's max γ, max K)
            start = time.perf_counter()
            self.warm_costs(*adaptive)
            logger.info("cost model ready in %.1f s (%s)", time.perf_counter() - start, state_dir() / "costs")


async def _client_left(request: Request) -> None:
    """Returns once the client has gone (the body is read already, so the next ASGI message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_client_leaves(work, request: Request):
    """Await ``work``; if the client disconnects first, cancel it (which ends its decode loop and frees its verifier
    session) and return ``CLIENT_LEFT``.

    Serve cancels a request whose client left, but only best effort: the cancel can be lost between the replica's
    threads (ray-project/ray#44647, cpython#105836), and a lost one would keep a full decode running for nobody.
    Watching the ASGI disconnect ourselves makes it certain. A streamed response returns at once; from then on
    Starlette's StreamingResponse watches for the disconnect."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_client_left(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done() and not gone.cancelled() and gone.exception() is None:  # wait() returned: gone is done
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return CLIENT_LEFT
        return await task  # done, or the watcher failed (then Serve's own cancellation is all there is)
    finally:
        task.cancel()  # no-op once done; on our own cancellation it stops the decode too
        gone.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await gone


@serve.ingress(api)
class Router:
    def __init__(self, drafter, verifier, models: ModelSource, options: RouterOptions):
        # The tokenizer comes from the pair named at start-up; a swapped-in pair must keep the vocabulary.
        self.core = OpenAIRouter(drafter, verifier, resolve_pair(models)[0], options,
                                 metrics=ServeMetrics(options.max_gamma))

    @api.post("/v1/completions")
    async def completions(self, request: Request):
        return await self._respond(self.core.completions, request)

    @api.post("/v1/chat/completions")
    async def chat_completions(self, request: Request):
        return await self._respond(self.core.chat, request)

    @api.get("/v1/models")
    async def models(self):
        return self.core.model_list()

    @api.get("/health")
    async def health(self):
        try:
            info = await self.core.info()
        except Exception as err:
            return JSONResponse({"status": "unavailable", "error": type(err).__name__}, status_code=503)
        return {"status": "ok", "model": self.core.models.model_id, **info}

    async def _respond(self, handler, request: Request):
        try:
            result = await _unless_client_leaves(handler(await request.body()), request)
        except ApiError as err:
            return JSONResponse(err.body(), status_code=err.status)
        except Exception as err:
            logger.exception("request failed")
            body = ApiError(f"{type(err).__name__}: {err}", status=500, kind="server_error").body()
            return JSONResponse(body, status_code=500)
        if result is CLIENT_LEFT:  # nobody reads this; nginx's "client closed request"
            return Response(status_code=499)
        if isinstance(result, dict):
            return JSONResponse(result)
        return StreamingResponse(result, media_type="text/event-stream")


def build_app(args: Optional[Union[Dict[str, Any], AppConfig]] = None) -> serve.Application:
    """Application builder: ``serve run serve_apps.specdiff:app drafter.max_replicas=4 pools=true``.

    Before anything is deployed: the default drafter is resolved (a ValueError says how to build it when it is
    missing), the embedded default verifier is converted from GGUF once (not by every replica at the same time), and
    a feature drafter is checked against the verifier (hidden size, tapped layers, vocabulary) and, unless
    ``colocate`` says otherwise, served colocated."""
    cfg = args if isinstance(args, AppConfig) else AppConfig.from_args(args)
    models = resolve_default(cfg.models)
    if models.verifier == DEFAULT_VERIFIER:
        resolve_model_path(DEFAULT_VERIFIER)
    check_pair(models)
    colocate = cfg.colocate if cfg.colocate is not None else feature_drafter_config(models) is not None
    cfg = cfg.model_copy(update={"models": models, "colocate": colocate})
    # A registry pair also reaches the model replicas as user_config: redeploying with another {"pair": ...} is a
    # Serve reconfigure (in place, no restart).
    follow = {"user_config": {"pair": cfg.models.pair}} if cfg.models.pair else {}
    router = serve.deployment(Router, name="Router", **cfg.router.deployment_options(None))
    if cfg.colocate:  # one deployment, both models, whole decodes; no session routing needed
        decoder = serve.deployment(
            DecodeDeployment, name="Decoder", **follow,
            **cfg.verifier.deployment_options(cfg.verifier_pool if cfg.pools else None),
        ).bind(cfg.models, cfg.verifier, _adaptive_bounds(cfg.router))
        return router.bind(None, decoder, cfg.models, cfg.router)
    drafter = serve.deployment(
        DrafterDeployment,
        name="Drafter",
        # A feature drafter keeps a draft cache per session: its calls carry the session id, like the verifier's.
        request_router_config=RequestRouterConfig(
            request_router_class=CONSISTENT_HASH_ROUTER,
            request_router_kwargs={"num_virtual_nodes": cfg.drafter.num_virtual_nodes},
        ),
        **follow,
        **cfg.drafter.deployment_options(cfg.drafter_pool if cfg.pools else None),
    ).bind(cfg.models, cfg.drafter)
    verifier = serve.deployment(
        VerifierDeployment,
        name="Verifier",
        request_router_config=RequestRouterConfig(
            request_router_class=CONSISTENT_HASH_ROUTER,
            request_router_kwargs={"num_virtual_nodes": cfg.verifier.num_virtual_nodes},
        ),
        **follow,
        **cfg.verifier.deployment_options(cfg.verifier_pool if cfg.pools else None),
    ).bind(cfg.models, cfg.verifier)
    return router.bind(drafter, verifier, cfg.models, cfg.router)
