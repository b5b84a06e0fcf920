"""Serving follows the registry: `models.pair` resolves models:/...@production to the registered pair, a promotion
reaches running replicas without a redeploy, and model swaps keep the servers exact (no stale KV caches)."""

from __future__ import annotations

import json
import time

import pytest
import torch

from registry_helpers import save_for


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory, specdiff_home):
    """The demo verifier (byte tokenizer) registered as specdiff-verifier-demo/1 with two drafters, v1 promoted."""
    from specdiff.lineage.evaluation import HeldoutSpec
    from specdiff.lifecycle.evaluate import Registry
    from specdiff.serving.config import ModelSource
    from specdiff.serving.models import byte_tokenizer, demo_verifier_model

    root = tmp_path_factory.mktemp("demo_store")
    tokenizer = byte_tokenizer()
    demo_verifier_model(ModelSource(), len(tokenizer)).save_pretrained(root / "verifier")
    tokenizer.save_pretrained(root / "verifier")
    prompts = root / "heldout.jsonl"
    prompts.write_text("".join(json.dumps({"prompt_ids": list(p.encode())}) + "\n" for p in ["Hello", "def f(x):"]))
    reg = Registry(f"sqlite:///{root / 'mlflow.db'}")
    verifier = reg.register_verifier("demo", root / "verifier")
    spec = HeldoutSpec(str(prompts), gamma=4, offsets=(0,), max_new_tokens=8)
    drafters = [reg.register_drafter("demo", save_demo_drafter(reg.local_dir(verifier), root / f"d{i}", i), verifier,
                                     spec) for i in (1, 2)]
    assert reg.promote("demo", drafters[0], spec)[0]
    return {"reg": reg, "spec": spec, "drafters": drafters, "root": root}


def save_demo_drafter(verifier_dir, out, seed: int):
    from specdiff import build_small_drafter, save_drafter
    from specdiff.lineage.verifier import verifier_record

    drafter = build_small_drafter(259, hidden_size=64, num_layers=1, num_heads=4, seed=seed)
    return save_drafter(drafter, out, verifier=verifier_record(verifier_dir).to_dict())


def test_pair_source_validation_names_the_field():
    from specdiff.serving.config import ModelSource

    with pytest.raises(ValueError, match="pair must look like models:/<name>@<alias>.*got 'specdiff-drafter-x'"):
        ModelSource(pair="specdiff-drafter-x")
    with pytest.raises(ValueError, match="drafter must be left unset when pair is set.*got '/some/folder'"):
        ModelSource(pair="models:/specdiff-drafter-x@production", drafter="/some/folder")


def test_resolve_pair_loads_the_registered_folders_and_checks_the_verifier(demo_store, tmp_path):
    from specdiff.serving.config import ModelSource
    from specdiff.serving.models import load_drafter, load_tokenizer, load_verifier, pair_label, resolve_pair

    source = ModelSource(pair="models:/specdiff-drafter-demo@production", tracking_uri=demo_store["reg"].uri)
    resolved, label = resolve_pair(source)
    assert label == "specdiff-drafter-demo/1" == pair_label(source) and resolved.pair is None
    assert load_drafter(resolved).vocab_size == 259 == load_verifier(resolved).vocab_size
    assert load_tokenizer(resolved).encode("Hi", add_special_tokens=False) == list(b"Hi")

    other = tmp_path / "other"  # another verifier build handed to the pair: refused at load time, naming both
    from specdiff.serving.models import demo_verifier_model

    demo_verifier_model(ModelSource(demo_seed=5), 259).save_pretrained(other)
    with pytest.raises(ValueError, match=r"verifier digest mismatch: drafter specdiff-drafter-demo/1 is aligned to "
                                         r"specdiff-verifier-demo/1"):
        resolve_pair(ModelSource(pair=source.pair, tracking_uri=source.tracking_uri, verifier=str(other)))
    with pytest.raises(ValueError, match="'specdiff-drafter-nope' does not exist"):
        resolve_pair(ModelSource(pair="models:/specdiff-drafter-nope@production", tracking_uri=source.tracking_uri))
    with pytest.raises(ValueError, match="has no alias 'canary'"):
        resolve_pair(ModelSource(pair="models:/specdiff-drafter-demo@canary", tracking_uri=source.tracking_uri))


def test_verifier_swap_drops_sessions_of_the_old_model(verifier_model):
    from helpers import tiny_llama

    from specdiff import HFVerifier, build_small_drafter
    from specdiff.serving.servers import DrafterServer, VerifierServer
    from specdiff.core.tree import build_tree, chain

    server = VerifierServer(HFVerifier(verifier_model))
    prompt = [10, 20, 30]
    server.score("s", prompt, None, build_tree(prompt[-1], torch.tensor([[1, 2], [1, 3]])))
    other = HFVerifier(tiny_llama(64, seed=9))
    server.swap(other, "specdiff-drafter-x/2")
    tokens, nxt = prompt + [1, 7], chain(7, [4])
    after = server.score("s", tokens, ([1], 7), nxt)  # would be a cache hit on the old model without the swap
    assert server.counts == {"hits": 0, "misses": 2, "evictions": 0} and server.info()["pair"] == "specdiff-drafter-x/2"
    torch.testing.assert_close(after, other.start(tokens).score(nxt), atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="verifier vocab_size must stay 64 across a swap, got 32"):
        server.swap(HFVerifier(tiny_llama(32)))
    drafters = DrafterServer(build_small_drafter(64, hidden_size=32, num_layers=1))
    with pytest.raises(ValueError, match="drafter vocab_size must stay 64 across a swap, got 10"):
        drafters.swap(build_small_drafter(10, hidden_size=32, num_layers=1))


@pytest.mark.slow
def test_running_replicas_follow_a_promotion(demo_store, serve_cluster):
    from ray import serve

    from serve_helpers import BASE, LocalReference, run_app
    from specdiff.serving.app import build_app
    from specdiff.serving.config import ModelSource

    reg, d2 = demo_store["reg"], demo_store["drafters"][1]
    small = {"num_cpus": 0.5}
    models = {"pair": "models:/specdiff-drafter-demo@production", "tracking_uri": reg.uri, "follow_s": 1}
    run_app(build_app({"models": models, "drafter": small, "verifier": small, "router": small}), "registry",
            "/registry")
    try:
        handles = [serve.get_deployment_handle(name, app_name="registry") for name in ("Drafter", "Verifier")]
        assert [h.info.remote().result()["pair"] for h in handles] == ["specdiff-drafter-demo/1"] * 2

        ok, reason = reg.promote("demo", d2, demo_store["spec"], force=True)  # no redeploy, no code change
        assert ok, reason
        deadline = time.monotonic() + 60
        while [h.info.remote().result()["pair"] for h in handles] != ["specdiff-drafter-demo/2"] * 2:
            assert time.monotonic() < deadline, "replicas did not follow the promotion within 60 s"
            time.sleep(1)

        import requests

        body = {"model": "specdiff-demo", "prompt": "Hello", "max_tokens": 24, "temperature": 0, "seed": 0,
                "gamma": 4, "num_candidates": 2}
        served = requests.post(BASE + "/registry/v1/completions", json=body, timeout=120).json()
        pair = reg.resolve_pair("models:/specdiff-drafter-demo@production")
        ref = LocalReference(ModelSource(verifier=str(pair.verifier_dir), drafter=str(pair.drafter_dir)))
        text, result = ref.complete("Hello", max_tokens=24, temperature=0, seed=0, gamma=4, k=2)
        assert served["choices"][0]["text"] == text  # the verifier's output, exactly
        spec = served["usage"]["speculative"]  # drafted by the promoted drafter v2
        assert (spec["rounds"], spec["accepted_per_position"]) == (result.stats.rounds,
                                                                   result.stats.accepted_per_position)
    finally:
        serve_cluster.delete("registry")
