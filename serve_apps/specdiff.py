"""``serve run serve_apps.specdiff:app [key=value ...]`` (from the repository root).

With no arguments it serves a TINY RANDOM-INIT DEMO model pair on CPU (gibberish text, real machinery); point
``models.verifier`` / ``models.drafter`` at real weights. See docs/serve.md and specdiff.serving.config.AppConfig.
"""

from specdiff.serving.app import build_app

app = build_app  # an application builder: Serve calls it with the `args` of `serve run` or the config YAML
