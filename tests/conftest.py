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
