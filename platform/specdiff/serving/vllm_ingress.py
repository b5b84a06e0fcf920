"""The vLLM app's ingress: Ray Serve LLM's OpenAI ingress, plus the load cap (``specdiff.serving.load_cap``).

A request for the speculative model goes to the speculative engine while at most ``cap`` such requests are in flight
through this ingress replica (itself included) and none of them is on the plain engine (``<model_id>-plain``, the
same verifier without a drafter), else to the plain engine (``LoadGate``); its response names the engine that served it (``model``). The count is this
replica's: with several ingress replicas each admits up to ``cap``. Imported only with vLLM installed
(``ray.serve.llm`` needs it).
"""

from __future__ import annotations

from ray.serve.llm.ingress import OpenAiIngress

from specdiff.serving.load_cap import LoadGate


class LoadCappedIngress(OpenAiIngress):
    def __init__(self, llm_deployments, model_cards, *, speculative_model_id: str, plain_model_id: str, cap: int,
                 **kwargs):
        super().__init__(llm_deployments, model_cards, **kwargs)
        for name in (speculative_model_id, plain_model_id):
            if name not in model_cards:
                raise ValueError(f"load cap: model {name!r} is not deployed (models: {sorted(model_cards)})")
        self._speculative, self._plain = speculative_model_id, plain_model_id
        self.gate = LoadGate(cap)

    async def _get_response(self, *, body, call_method: str, raw_request=None):
        if (body.model or self._speculative) != self._speculative:  # the plain model asked by name, or another
            async for response in super()._get_response(body=body, call_method=call_method, raw_request=raw_request):
                yield response
            return
        speculate = self.gate.enter()
        try:
            target = self._speculative if speculate else self._plain
            if body.model != target:  # also a request that names no model (two are deployed)
                body = body.model_copy(update={"model": target})
            async for response in super()._get_response(body=body, call_method=call_method, raw_request=raw_request):
                yield response
        finally:
            self.gate.leave(speculate)
