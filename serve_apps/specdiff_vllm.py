"""``serve run serve_apps.specdiff_vllm:app [key=value ...]`` (from the repository root, in the vLLM virtualenv).

The embedded default verifier and its built feature drafter inside vLLM (speculative method ``dflash``), served by
Ray Serve LLM with vLLM's OpenAI API and continuous batching; on CPUs or GPUs. Keys: ``gamma``,
``speculation_max_batch``, ``drafter`` (a folder, or none), ``num_gpus``, ``max_replicas``, ... (see
specdiff.serving.vllm_app.VLLMAppConfig and docs/vllm.md).
"""

from specdiff.serving.vllm_app import build_vllm_app

app = build_vllm_app  # an application builder: Serve calls it with the `args` of `serve run` or the config YAML
