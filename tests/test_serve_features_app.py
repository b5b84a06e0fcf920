"""The Serve app with a feature drafter, end to end on CPU: a tiny feature drafter (built from the demo verifier's
config, fitted in seconds) on its own deployment; the verifier replica taps the layers the drafter's record names;
features travel verifier replica -> router -> drafter replica. Outputs equal the in-process decode; draft caches
evicted under concurrency (one session per drafter replica) are rebuilt and the output stays exact."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from serve_helpers import BASE, FEATURE_PROMPTS, MODEL, fitted_feature_drafter, run_app
from specdiff import SamplingParams, SpecConfig, SpeculativeDecoder, generate_plain
from specdiff.models.feature_drafter import save_feature_drafter
from specdiff.serving.config import ModelSource
from specdiff.serving.models import byte_tokenizer, demo_verifier_model
from specdiff.models.verifier import HFVerifier

pytestmark = pytest.mark.slow
SMALL = {"num_cpus": 0.5}
GAMMA = 4


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    model = demo_verifier_model(ModelSource(demo=True), len(byte_tokenizer()))
    drafter = fitted_feature_drafter(model, gamma=GAMMA)
    folder = save_feature_drafter(drafter, tmp_path_factory.mktemp("drafters") / "feature")
    return {"folder": str(folder), "drafter": drafter, "verifier": HFVerifier(model, tap_layers=drafter.tap_layers)}


@pytest.fixture(scope="module")
def app(serve_cluster, local):
    from specdiff.serving.app import build_app

    args = {
        "models": {"verifier": "demo", "drafter": local["folder"]},
        "drafter": {**SMALL, "max_sessions": 1},  # concurrent requests evict each other's draft caches
        "verifier": {**SMALL, "feature_dtype": "float32"},  # drafts bit-identical to the in-process decode's
        "router": {**SMALL, "gamma": GAMMA, "num_candidates": 3},
        "colocate": False,  # separate Drafter and Verifier deployments (a feature drafter's default is colocated)
    }
    run_app(build_app(args), "features", "/features")
    yield BASE + "/features"
    serve_cluster.delete("features")


def complete(url, prompt, **extra):
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 40, **extra}
    response = requests.post(url + "/v1/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()


def ids(text):
    return byte_tokenizer().encode(text, add_special_tokens=False)


def text(tokens):
    return byte_tokenizer().decode(tokens, skip_special_tokens=True)


def drafter_stats():
    from ray import serve

    return serve.get_deployment_handle("Drafter", app_name="features").cache_stats.remote().result()


def test_served_feature_drafter_equals_local(app, local):
    eos = [byte_tokenizer().eos_token_id]
    for prompt in FEATURE_PROMPTS[:3]:
        greedy = generate_plain(local["verifier"], ids(prompt), max_new_tokens=40, stop_token_ids=eos)
        body = complete(app, prompt, temperature=0.0)
        assert body["choices"][0]["text"] == text(greedy.tokens)
        assert body["usage"]["speculative"]["tau"] > 2.5  # windows accepted: the committed rows are right
        assert body["usage"]["speculative"]["fallbacks"] == 0
        spec = SpecConfig(gamma=GAMMA, num_candidates=3)
        want = SpeculativeDecoder(local["drafter"], local["verifier"]).generate(
            ids(prompt), max_new_tokens=40, sampling=SamplingParams(temperature=1.0), spec=spec, seed=9,
            stop_token_ids=eos)
        assert complete(app, prompt, temperature=1.0, seed=9)["choices"][0]["text"] == text(want.tokens)


def test_evicted_draft_caches_are_rebuilt_exactly(app, local):
    eos = [byte_tokenizer().eos_token_id]
    before = drafter_stats()
    with ThreadPoolExecutor(len(FEATURE_PROMPTS)) as pool:
        bodies = list(pool.map(lambda p: complete(app, p, temperature=0.0), FEATURE_PROMPTS))
    for prompt, body in zip(FEATURE_PROMPTS, bodies):
        greedy = generate_plain(local["verifier"], ids(prompt), max_new_tokens=40, stop_token_ids=eos)
        assert body["choices"][0]["text"] == text(greedy.tokens)
    after = drafter_stats()
    assert after["evictions"] > before["evictions"] and after["misses"] > before["misses"]
    deadline = time.monotonic() + 30  # finished requests close their draft caches
    while drafter_stats()["sessions"] and time.monotonic() < deadline:
        time.sleep(0.5)
    assert drafter_stats()["sessions"] == 0


@pytest.fixture(scope="module")
def colocated(serve_cluster, local):
    from specdiff.serving.app import build_app

    # No `colocate`: a feature drafter is served colocated by default.
    args = {"models": {"verifier": "demo", "drafter": local["folder"]}, "verifier": SMALL,
            "router": {**SMALL, "gamma": GAMMA, "num_candidates": 3}}
    run_app(build_app(args), "features-colo", "/features-colo")
    yield BASE + "/features-colo"
    serve_cluster.delete("features-colo")


def test_feature_drafter_is_served_colocated_by_default_and_exact(colocated, local):
    from ray import serve

    assert set(serve.status().applications["features-colo"].deployments) == {"Router", "Decoder"}
    eos = [byte_tokenizer().eos_token_id]
    spec = SpecConfig(gamma=GAMMA, num_candidates=3)
    for prompt in FEATURE_PROMPTS[:2]:
        greedy = generate_plain(local["verifier"], ids(prompt), max_new_tokens=40, stop_token_ids=eos)
        body = complete(colocated, prompt, temperature=0.0)
        assert body["choices"][0]["text"] == text(greedy.tokens)
        assert body["usage"]["speculative"]["tau"] > 2.5
        want = SpeculativeDecoder(local["drafter"], local["verifier"]).generate(
            ids(prompt), max_new_tokens=40, sampling=SamplingParams(temperature=1.0), spec=spec, seed=9,
            stop_token_ids=eos)
        body = complete(colocated, prompt, temperature=1.0, seed=9)
        assert body["choices"][0]["text"] == text(want.tokens)
        assert body["usage"]["speculative"]["rounds"] == want.stats.rounds  # the same rounds, drawn the same way
