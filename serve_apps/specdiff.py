"""``serve run serve_apps.specdiff:app [key=value ...]`` (from the repository root): an alias of the installed
package's builder, ``serve run specdiff.serving.app:build_app``, which works from anywhere (clusters/*.yaml use it).

With no arguments it serves the embedded default pair (SmolLM2-135M-Instruct and its built feature drafter,
colocated on one Decoder deployment; ``colocate=false``: separate Drafter and Verifier deployments);
``models.demo=true`` serves the tiny random-init demo pair the tests use; ``models.verifier`` / ``models.drafter``
point at other weights. See docs/serve.md and specdiff.serving.config.AppConfig. vLLM instead:
``serve_apps.specdiff_vllm:app``.
"""

from specdiff.serving.app import build_app

app = build_app  # an application builder: Serve calls it with the `args` of `serve run` or the config YAML
