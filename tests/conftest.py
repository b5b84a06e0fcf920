import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from helpers import tiny_llama  # noqa: E402

# The tests run tiny models: one intra-op thread is faster for them and robust when the machine is loaded
# (oversubscribed OpenMP threads slow tiny forwards by an order of magnitude). Tests of real models raise it.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def verifier_model():
    return tiny_llama(64, seed=0)


@pytest.fixture(scope="session")
def specdiff_home(tmp_path_factory):
    """One state directory for the session: the default verifier is converted from GGUF once, then reused."""
    import os

    home = tmp_path_factory.mktemp("specdiff_home")
    previous = os.environ.get("SPECDIFF_HOME")
    os.environ["SPECDIFF_HOME"] = str(home)
    yield home
    if previous is None:
        os.environ.pop("SPECDIFF_HOME", None)
    else:
        os.environ["SPECDIFF_HOME"] = previous


@pytest.fixture(scope="session")
def serve_cluster():
    """One private in-process Ray + Serve (HTTP on 127.0.0.1:8011) for every Serve test; shut down at the end."""
    from serve_helpers import start_ray

    ray, serve = start_ray()
    yield serve
    serve.shutdown()
    ray.shutdown()
