"""The Serve app's Decoder replica batching its decodes (``verifier.batching``, the default), end to end: the demo
pair in the lean forward (``models.backend=specdiff``, what a Llama verifier runs), a feature drafter colocated, many
requests at once. Every reply equals its prompt decoded alone in process."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from serve_helpers import BASE, FEATURE_PROMPTS, MODEL, fitted_feature_drafter, run_app
from specdiff import generate_plain
from specdiff.models.feature_drafter import save_feature_drafter
from specdiff.models.llama import from_state
from specdiff.models.verifier import HFVerifier
from specdiff.serving.config import ModelSource
from specdiff.serving.models import byte_tokenizer, demo_verifier_model

pytestmark = pytest.mark.slow
SMALL = {"num_cpus": 0.5}
PROMPTS = FEATURE_PROMPTS + ["abc abc abc", "Dear Sir,", "x = [1, 2,", "import os\n"]


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    model = demo_verifier_model(ModelSource(demo=True), len(byte_tokenizer()))
    drafter = fitted_feature_drafter(model, gamma=4)
    folder = save_feature_drafter(drafter, tmp_path_factory.mktemp("drafters") / "feature")
    lean = from_state(model.config.to_dict(), model.state_dict())
    return {"folder": str(folder), "drafter": drafter, "verifier": HFVerifier(lean, tap_layers=drafter.tap_layers)}


@pytest.fixture(scope="module")
def app(serve_cluster, local):
    from specdiff.serving.app import build_app

    args = {"models": {"verifier": "demo", "drafter": local["folder"], "backend": "specdiff"},
            "verifier": SMALL, "router": SMALL}
    run_app(build_app(args), "batched", "/batched")
    yield BASE + "/batched"
    serve_cluster.delete("batched")


def ids(text):
    return byte_tokenizer().encode(text, add_special_tokens=False)


def complete(url, prompt, **extra):
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 32, **extra}
    response = requests.post(url + "/v1/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()


def test_concurrent_requests_share_steps_and_each_equals_its_decode_alone(app, local):
    from ray import serve

    decoder = serve.get_deployment_handle("Decoder", app_name="batched")
    assert decoder.info.remote().result()["batching"]
    eos = [byte_tokenizer().eos_token_id]
    tok = byte_tokenizer()
    greedy = [tok.decode(generate_plain(local["verifier"], ids(p), max_new_tokens=32, stop_token_ids=eos).tokens,
                         skip_special_tokens=True) for p in PROMPTS]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:  # T=0, the app's adaptive policy
        bodies = list(pool.map(lambda p: complete(app, p, temperature=0.0), PROMPTS))
    assert [b["choices"][0]["text"] for b in bodies] == greedy
    # T=1 with fixed γ and K: the seeded per-round streams keep each reply independent of its batch-mates. Compared
    # with the same replica's replies one at a time (in-process equality at T>0 is tests/test_batched.py's; a
    # replica's thread count can round a product differently from this process's)
    def sample(ip):
        return complete(app, ip[1], temperature=1.0, seed=ip[0], gamma=4, num_candidates=2)["choices"][0]["text"]

    alone = [sample(ip) for ip in enumerate(PROMPTS)]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(sample, enumerate(PROMPTS)))
    assert together == alone
