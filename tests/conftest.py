import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from helpers import tiny_llama  # noqa: E402


@pytest.fixture(scope="session")
def verifier_model():
    return tiny_llama(64, seed=0)


@pytest.fixture(scope="session")
def serve_cluster():
    """One private in-process Ray + Serve (HTTP on 127.0.0.1:8011) for every Serve test; shut down at the end."""
    from serve_helpers import start_ray

    ray, serve = start_ray()
    yield serve
    serve.shutdown()
    ray.shutdown()
