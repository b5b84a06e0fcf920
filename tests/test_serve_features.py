"""Serving a feature drafter, as plain classes over fake handles (no Ray): the verifier replica returns the tapped
features of each scored tree, the router forwards the committed rows, the drafter replica keeps per-session draft
caches and rebuilds them from the verifier's rows on a miss; the output stays exact. Plus the deploy-time checks and
the default model source."""

from __future__ import annotations

import pytest
import torch
from ray import exceptions as ray_errors

from serve_helpers import FEATURE_PROMPTS, FakeHandle, fitted_feature_drafter
from specdiff import SamplingParams, SpecConfig, SpeculationCosts, SpeculativeDecoder, generate_plain
from specdiff.models.feature_drafter import build_feature_drafter, save_feature_drafter
from specdiff.serving.config import DEMO, ModelSource
from specdiff.serving.models import byte_tokenizer, demo_verifier_model
from specdiff.serving.remote import RemoteDrafter, RemoteVerifier
from specdiff.serving.servers import DrafterServer, VerifierServer
from specdiff.serving.wire import FeatureRows, NeedFeatures
from specdiff.models.verifier import HFVerifier

from helpers import tiny_llama

GAMMA = 4


@pytest.fixture(scope="module")
def pair():
    model = demo_verifier_model(ModelSource(demo=True), len(byte_tokenizer()))
    drafter = fitted_feature_drafter(model, gamma=GAMMA)
    return drafter, HFVerifier(model, tap_layers=drafter.tap_layers)


def prompt_ids(text):
    return byte_tokenizer().encode(text, add_special_tokens=False)


class Replaced:
    """A handle whose target is replaced by a fresh drafter replica after ``after`` calls (a new replica after a
    re-route or a restart: it has no draft cache)."""

    def __init__(self, make, after):
        self.make, self.after, self.calls = make, after, 0
        self.servers = [make()]
        self.handle = FakeHandle(self.servers[0])

    def options(self, **kw):
        return self

    def __getattr__(self, name):
        self.calls += 1
        if self.calls == self.after:
            self.servers.append(self.make())
            self.handle.target = self.servers[-1]
        return getattr(self.handle, name)


def remote_pair(drafter, verifier, *, feature_dtype="float32", drafter_handle=None, **drafter_kw):
    vserver = VerifierServer(verifier, feature_dtype=feature_dtype)
    dserver = DrafterServer(drafter)
    handle = drafter_handle or FakeHandle(dserver)
    remote_d = RemoteDrafter(handle, drafter.vocab_size, tap_layers=dserver.tap_layers, timeout_s=30, **drafter_kw)
    remote_v = RemoteVerifier(FakeHandle(vserver), verifier.vocab_size, verifier.max_context,
                              tap_layers=vserver.info()["tap_layers"])
    return remote_d, remote_v, dserver, vserver


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_served_feature_drafter_equals_in_process_decode(pair, temperature):
    """float32 on the wire: the drafter replica sees exactly the in-process drafter's features, so even a seeded
    T>0 decode matches token for token; at T=0 both equal plain greedy decoding."""
    drafter, verifier = pair
    d, v, dserver, vserver = remote_pair(drafter, verifier)
    spec = SpecConfig(gamma=GAMMA, num_candidates=3)
    for text in FEATURE_PROMPTS[:3]:
        opts = dict(max_new_tokens=40, sampling=SamplingParams(temperature=temperature), spec=spec, seed=5)
        served = SpeculativeDecoder(d, v).generate(prompt_ids(text), **opts)
        local = SpeculativeDecoder(drafter, verifier).generate(prompt_ids(text), **opts)
        assert served.tokens == local.tokens and served.stats.accepted == local.stats.accepted
        if temperature == 0:
            assert served.tokens == generate_plain(verifier, prompt_ids(text), max_new_tokens=40).tokens
            assert served.stats.tau > 2.5  # whole windows accepted: the committed rows [root, *path] are used
    assert dserver.counts["misses"] == 0 and vserver.counts["misses"] == 3  # one prefill per request
    v.close()
    assert vserver.sessions() == {}


def test_float16_features_stay_exact_at_t0(pair):
    drafter, verifier = pair
    d, v, dserver, _ = remote_pair(drafter, verifier, feature_dtype="float16")
    ids = prompt_ids(FEATURE_PROMPTS[1])
    served = SpeculativeDecoder(d, v).generate(ids, max_new_tokens=40, sampling=SamplingParams(temperature=0),
                                               spec=SpecConfig(gamma=GAMMA, num_candidates=2), seed=0)
    assert served.tokens == generate_plain(verifier, ids, max_new_tokens=40).tokens
    assert served.stats.tau > 2.5
    row = drafter.config.feature_size * 2  # bytes of one token's features in float16
    # Each round sends only its committed rows (the prompt's once): every row held was sent once, not once a round.
    (held,) = dserver.sessions().values()
    assert held >= len(ids) - 1 + len(served.tokens) - GAMMA - 1
    assert dserver.counts["feature_bytes"] == row * held


@pytest.mark.parametrize("after", [3, 6])
def test_drafter_cache_miss_rebuilds_from_the_verifier(pair, after):
    """A new drafter replica mid-decode has no draft cache: it answers NeedFeatures, the router reads the prefix's
    rows from the verifier replica and sends them once; the decode is unchanged."""
    drafter, verifier = pair
    handle = Replaced(lambda: DrafterServer(drafter), after)
    d, v, _, vserver = remote_pair(drafter, verifier, drafter_handle=handle)
    ids = prompt_ids(FEATURE_PROMPTS[3])
    opts = dict(max_new_tokens=40, sampling=SamplingParams(temperature=1.0), spec=SpecConfig(gamma=GAMMA,
                num_candidates=3), seed=2)
    served = SpeculativeDecoder(d, v).generate(ids, **opts)
    assert served.tokens == SpeculativeDecoder(drafter, verifier).generate(ids, **opts).tokens
    new = handle.servers[-1]
    assert len(handle.servers) == 2 and new.counts["misses"] == 1 and new.counts["hits"] > 0
    assert served.stats.fallbacks == 0
    features = v.sessions[0].features
    assert features.fetches == 2  # the prompt's rows, then the whole prefix for the new replica


def test_evicted_draft_and_verifier_sessions_stay_exact(pair):
    drafter, verifier = pair
    vserver = VerifierServer(verifier, max_sessions=1, feature_dtype="float32")
    dserver = DrafterServer(drafter, max_sessions=1)
    d = RemoteDrafter(FakeHandle(dserver), drafter.vocab_size, tap_layers=dserver.tap_layers, timeout_s=30)
    spec = SpecConfig(gamma=GAMMA, num_candidates=2)
    streams, want = [], []
    for text in FEATURE_PROMPTS[:3]:  # three interleaved decodes over one-session replicas: every round misses
        v = RemoteVerifier(FakeHandle(vserver), verifier.vocab_size, None, tap_layers=drafter.tap_layers)
        streams.append(SpeculativeDecoder(d, v).stream(prompt_ids(text), max_new_tokens=30, spec=spec,
                                                       sampling=SamplingParams(temperature=0), seed=0))
        want.append(generate_plain(verifier, prompt_ids(text), max_new_tokens=30).tokens)
    live = list(streams)
    while live:
        for s in list(live):
            if next(s, None) is None:
                live.remove(s)
    assert [s.tokens for s in streams] == want
    assert dserver.counts["misses"] > 3 and dserver.counts["evictions"] > 3 and vserver.counts["evictions"] > 3
    assert all(s.stats.fallbacks == 0 and s.stats.tau > 2 for s in streams)


def test_drafter_down_falls_back_exactly_and_catches_up(pair):
    drafter, verifier = pair
    dserver = DrafterServer(drafter)
    handle = FakeHandle(dserver, failures=[ray_errors.ActorDiedError()] * 3)
    d, v, _, _ = remote_pair(drafter, verifier, drafter_handle=handle, cooldown_s=0.0)
    ids = prompt_ids(FEATURE_PROMPTS[0])
    got = SpeculativeDecoder(d, v).generate(ids, max_new_tokens=40, sampling=SamplingParams(temperature=0),
                                            spec=SpecConfig(gamma=GAMMA, num_candidates=2), seed=0)
    assert got.tokens == generate_plain(verifier, ids, max_new_tokens=40).tokens
    assert got.stats.fallbacks == 3 and got.stats.rounds > 0 and got.stats.tau > 2
    # Rows committed by the three plain steps were kept by the router and sent once the drafter was back.
    assert dserver.counts["misses"] == 0


def test_drafter_server_marginals_equal_the_in_process_drafter(pair):
    drafter, verifier = pair
    server = DrafterServer(drafter)
    ids = prompt_ids("Once upon a time")
    feats = verifier.start(ids + [0]).features  # rows of every token of ids
    n = len(ids) - 1
    first = server.propose_features("s", ids[-1], n, GAMMA, FeatureRows.encode(feats[:n], 0, "float32"))
    torch.testing.assert_close(first, drafter.propose(ids, GAMMA, feats[:n]))
    # Only the new rows on the next call; a call that skips rows is told what the replica has.
    more = torch.cat([feats[:n], torch.randn(3, feats.shape[1])])
    skipped = FeatureRows.encode(more[n + 2 :], n + 2, "float32")
    assert server.propose_features("s", 7, n + 3, GAMMA, skipped) == NeedFeatures(n)
    step = server.propose_features("s", 7, n + 3, GAMMA, FeatureRows.encode(more[n:], n, "float32"))
    torch.testing.assert_close(step, drafter.propose(ids + [1, 2, 7], GAMMA, more), atol=1e-5, rtol=1e-4)
    assert server.propose_features("t", 7, n, GAMMA, None) == NeedFeatures(0)  # never seen
    assert server.sessions() == {"s": n + 3} and server.close("s") and server.sessions() == {}


def test_feature_rows_round_trip():
    x = torch.randn(5, 12)
    for dtype, tol in (("float32", 0), ("float16", 1e-3), ("bfloat16", 1e-2)):
        rows = FeatureRows.encode(x, 7, dtype)
        assert (rows.start, rows.stop, rows.nbytes) == (7, 12, 5 * 12 * (4 if dtype == "float32" else 2))
        torch.testing.assert_close(rows.decode().float(), x, atol=tol * 4, rtol=tol)
    with pytest.raises(ValueError, match="overflow float16"):
        FeatureRows.encode(torch.tensor([[1e6]]), 0)


# -- deploy-time checks --------------------------------------------------------------------------------------------


def _llama(layers):
    """The demo verifier's shape (hidden 64, byte vocabulary) with another depth."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=259, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2)
    return LlamaForCausalLM(config)


def _save(tmp_path, name, model, **kw):
    drafter = build_feature_drafter(model, num_layers=1, init_from_verifier=False, **kw)
    return str(save_feature_drafter(drafter, tmp_path / name))


def test_mismatched_feature_drafter_is_refused_at_deploy_time(tmp_path):
    from specdiff.serving.app import build_app

    other_hidden = _save(tmp_path, "h32", tiny_llama(259, seed=0), target_layer_ids=[0, 1])  # hidden size 32
    with pytest.raises(ValueError, match="hidden size 32.*has hidden size 64"):
        build_app({"models": {"verifier": DEMO, "drafter": other_hidden}})
    deeper = _save(tmp_path, "deep", _llama(layers=4), target_layer_ids=[1, 3])
    with pytest.raises(ValueError, match=r"layers \[1, 3\] \(2 taps\).*only 2 layers"):
        build_app({"models": {"verifier": DEMO, "drafter": deeper}})
    fits = _save(tmp_path, "fits", demo_verifier_model(ModelSource(demo=True), 259), target_layer_ids=[0, 1])
    app = build_app({"models": {"verifier": DEMO, "drafter": fits}})  # no error: the shapes fit
    # A feature drafter is served colocated unless told otherwise; a standalone drafter on its own deployment.
    assert _model_deployments(app) == [None, "Decoder"]
    assert _model_deployments(build_app({"models": {"verifier": DEMO, "drafter": fits}, "colocate": False})) == [
        "Drafter", "Verifier"]
    assert _model_deployments(build_app({"models": {"demo": True}})) == ["Drafter", "Verifier"]
    assert _model_deployments(build_app({"models": {"demo": True}, "colocate": True})) == [None, "Decoder"]


def _model_deployments(app) -> list:
    """The Router's bound handles' deployment names (Ray's application graph; None: no such handle)."""
    router = app._bound_deployment
    assert router.name == "Router"
    return [a._bound_deployment.name if a is not None else None for a in router.init_args[:2]]


# -- the default model source --------------------------------------------------------------------------------------


def test_model_source_defaults_to_the_embedded_pair():
    from specdiff.models.sources import DEFAULT_VERIFIER

    default = ModelSource()
    assert (default.verifier, default.drafter, default.model_id) == (DEFAULT_VERIFIER, "default", DEFAULT_VERIFIER)
    demo = ModelSource.model_validate({"demo": "true"})  # as `serve run ... models.demo=true` passes it
    assert (demo.verifier, demo.drafter, demo.model_id) == (DEMO, DEMO, "specdiff-demo")
    with pytest.raises(ValueError, match="drafter must be left unset with demo=true"):
        ModelSource(demo=True, drafter="/some/folder")


def test_default_drafter_resolution(tmp_path, monkeypatch):
    from specdiff.serving.models import resolve_default

    monkeypatch.setenv("SPECDIFF_HOME", str(tmp_path))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(ValueError, match=r"not built .*specdiff build.*models.demo=true"):
        resolve_default(ModelSource())
    assert not (tmp_path / "mlflow.db").exists()  # looking did not create a store
    folder = tmp_path / "drafters" / "default"
    _save(tmp_path / "drafters", "default", demo_verifier_model(ModelSource(demo=True), 259), target_layer_ids=[0])
    assert resolve_default(ModelSource()).drafter == str(folder)
    assert resolve_default(ModelSource(demo=True)).drafter == DEMO


def test_served_adaptive_decode_calibrates_through_the_replicas(pair):
    """SpecConfig() served (the router's default): the cost model is measured with the calls a served round makes
    (the feature drafter's ``draft`` with the session's rows, the verifier replica's ``verify``/``step``), the policy
    then chooses γ/K per round from the outcomes that came back; T=0 equals plain, and with the costs given a
    seeded T=1 decode equals the in-process adaptive one."""
    drafter, verifier = pair
    d, v, dserver, vserver = remote_pair(drafter, verifier)
    ids = prompt_ids(FEATURE_PROMPTS[0])
    decoder = SpeculativeDecoder(d, v)
    served = decoder.generate(ids, max_new_tokens=40, sampling=SamplingParams(temperature=0), seed=0)
    assert served.tokens == generate_plain(verifier, ids, max_new_tokens=40).tokens
    assert decoder.costs is not None and served.stats.calibration_s > 0
    # What it then chooses depends on the timings (a tiny model's); with costs given, choices are reproducible.
    cheap = SpeculationCosts.affine(draft_s=0.001, base_s=0.01, per_node_s=0.0001)
    opts = dict(max_new_tokens=40, sampling=SamplingParams(temperature=1.0), seed=3)
    got = SpeculativeDecoder(d, v, costs=cheap).generate(ids, **opts)
    want = SpeculativeDecoder(drafter, verifier, costs=cheap).generate(ids, **opts)
    assert got.tokens == want.tokens and got.stats.choices == want.stats.choices and got.stats.rounds > 0
    greedy = SpeculativeDecoder(d, v, costs=cheap).generate(ids, max_new_tokens=40, seed=0)  # T=0: what it learnt
    assert greedy.tokens == served.tokens and greedy.stats.tau > 1.5  # whole windows accepted, served
    v.close()
    assert vserver.sessions() == {}  # the calibration's throwaway session is closed with the request's


def test_adaptive_plain_runs_keep_the_feature_rows_whole(pair):
    """A feature drafter served with costs that make plain steps win until probes show the drafter is good: the
    plain runs' committed rows reach the drafter replica like a round's, so served drafts, choices and acceptance
    equal the in-process decode's."""
    drafter, verifier = pair
    d, v, _, _ = remote_pair(drafter, verifier)
    costs = SpeculationCosts.affine(draft_s=0.005, base_s=0.009, per_node_s=0.001)
    ids = prompt_ids(FEATURE_PROMPTS[0])
    opts = dict(max_new_tokens=64, sampling=SamplingParams(temperature=0.0), seed=1)
    served = SpeculativeDecoder(d, v, costs=costs).generate(ids, **opts)
    local = SpeculativeDecoder(drafter, verifier, costs=costs).generate(ids, **opts)
    assert served.tokens == local.tokens and served.stats.choices == local.stats.choices
    assert served.stats.accepted_per_position == local.stats.accepted_per_position
    assert served.stats.choices["plain"] > 1 and served.stats.rounds > 0, served.stats.choices
