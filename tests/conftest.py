import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from helpers import tiny_llama  # noqa: E402


@pytest.fixture(scope="session")
def verifier_model():
    return tiny_llama(64, seed=0)
