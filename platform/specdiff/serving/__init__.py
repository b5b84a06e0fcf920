"""Ray Serve deployment of the engine: Drafter / Verifier / Router, an OpenAI-compatible API, metrics."""

from specdiff.serving.config import AppConfig, DrafterOptions, ModelSource, PoolOptions, RouterOptions, VerifierOptions
from specdiff.serving.servers import DrafterServer, VerifierServer

__all__ = [
    "AppConfig",
    "DrafterOptions",
    "DrafterServer",
    "ModelSource",
    "PoolOptions",
    "RouterOptions",
    "VerifierOptions",
    "VerifierServer",
    "build_app",
]


def build_app(args=None):
    """See ``specdiff.serving.app.build_app`` (imported lazily: it pulls in FastAPI)."""
    from specdiff.serving.app import build_app as build

    return build(args)
