"""The Serve application: Drafter and Verifier deployments on their own pools, a FastAPI Router as ingress.

``build_app`` is the application builder behind ``serve run serve_apps.specdiff:app [key=value ...]`` and the
Serve config YAML's ``import_path`` + ``args``.

    Router (ingress, OpenAI API) --handle--> Drafter  (stateless, @serve.batch, drafter_pool)
                                 --handle--> Verifier (KV-cache sessions, consistent-hash on session id, verifier_pool)
"""


import asyncio
import functools
import logging
from typing import Any, Dict, Optional, Union

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from ray import serve
from ray.serve.config import RequestRouterConfig

from .config import AppConfig, DrafterOptions, ModelSource, RouterOptions, VerifierOptions
from .metrics import ServeMetrics
from .models import load_drafter, load_verifier
from .protocol import ApiError
from .router import OpenAIRouter
from .servers import DrafterServer, VerifierServer

logger = logging.getLogger(__name__)
CONSISTENT_HASH_ROUTER = "ray.serve.experimental.consistent_hash_router.ConsistentHashRouter"

api = FastAPI(title="specdiff", description="Speculative decoding with a masked-diffusion drafter (OpenAI API)")


class DrafterDeployment(DrafterServer):
    def __init__(self, models: ModelSource, options: DrafterOptions):
        super().__init__(functools.partial(load_drafter, models))
        self.propose.set_max_batch_size(options.max_batch_size)
        self.propose.set_batch_wait_timeout_s(options.batch_wait_timeout_s)

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.004)
    async def propose(self, prefixes: list[list[int]], gammas: list[int]) -> list:
        """Called per prefix; Serve hands it the calls queued meanwhile as lists, answered by one batched forward."""
        return await asyncio.to_thread(self.propose_many, prefixes, gammas)


class VerifierDeployment(VerifierServer):
    def __init__(self, models: ModelSource, options: VerifierOptions):
        super().__init__(
            functools.partial(load_verifier, models),
            max_sessions=options.max_sessions,
            kv_cache_budget_mb=options.kv_cache_budget_mb,
        )


@serve.ingress(api)
class Router:
    def __init__(self, drafter, verifier, models: ModelSource, options: RouterOptions):
        self.core = OpenAIRouter(drafter, verifier, models, options, metrics=ServeMetrics(options.max_gamma))

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
            result = await handler(await request.body())
        except ApiError as err:
            return JSONResponse(err.body(), status_code=err.status)
        except Exception as err:
            logger.exception("request failed")
            body = ApiError(f"{type(err).__name__}: {err}", status=500, kind="server_error").body()
            return JSONResponse(body, status_code=500)
        if isinstance(result, dict):
            return JSONResponse(result)
        return StreamingResponse(result, media_type="text/event-stream")


def build_app(args: Optional[Union[Dict[str, Any], AppConfig]] = None) -> serve.Application:
    """Application builder: ``serve run serve_apps.specdiff:app drafter.max_replicas=4 pools=true``."""
    cfg = args if isinstance(args, AppConfig) else AppConfig.from_args(args)
    drafter = serve.deployment(
        DrafterDeployment, name="Drafter", **cfg.drafter.deployment_options(cfg.drafter_pool if cfg.pools else None)
    ).bind(cfg.models, cfg.drafter)
    verifier = serve.deployment(
        VerifierDeployment,
        name="Verifier",
        request_router_config=RequestRouterConfig(
            request_router_class=CONSISTENT_HASH_ROUTER,
            request_router_kwargs={"num_virtual_nodes": cfg.verifier.num_virtual_nodes},
        ),
        **cfg.verifier.deployment_options(cfg.verifier_pool if cfg.pools else None),
    ).bind(cfg.models, cfg.verifier)
    router = serve.deployment(Router, name="Router", **cfg.router.deployment_options(None))
    return router.bind(drafter, verifier, cfg.models, cfg.router)
