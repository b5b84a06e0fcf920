"""Continuous batching (specdiff.models.batched): many sessions' passes in one ragged forward, each session decoding
exactly what it decodes alone."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from helpers import OracleDrafter
from test_llama import save_tiny

from specdiff import SamplingParams, SpecConfig, SpeculativeDecoder, generate_plain
from specdiff.core.tree import build_tree, chain as chain_of
from specdiff.models.batched import BatchedVerifier, StepBatcher
from specdiff.models.feature_drafter import build_feature_drafter
from specdiff.models.llama import Piece, load_llama
from specdiff.models.verifier import HFVerifier

PROMPTS = [[5, 9, 2, 7, 1], [3] * 11, [40, 41, 42], list(range(60, 100)), [7, 7, 8], [2, 30, 4, 50, 6, 70]]


@pytest.fixture(scope="module")
def lean(tmp_path_factory):
    return load_llama(save_tiny(tmp_path_factory.mktemp("tiny")))


def test_ragged_forward_equals_each_sequence_alone(lean):
    """Prefills, a tree over a cached prefix and a plain step, laid end to end: every piece's logits, tapped states
    and extended cache equal its own forward's."""
    taps = (0, 2)
    alone, together = [], []
    for tokens in PROMPTS[:3]:
        cache = lean.new_cache()
        out = lean(torch.tensor([tokens]), past_key_values=cache, output_hidden_states=True)
        alone.append((out.logits[0], torch.cat([out.hidden_states[i + 1] for i in taps], -1)[0], cache))
    caches = [lean.new_cache() for _ in PROMPTS[:3]]
    got = lean.forward_ragged([Piece(torch.tensor(t), c) for t, c in zip(PROMPTS[:3], caches)], taps)
    for (logits, feats, cache), (glogits, gfeats), gcache in zip(alone, got, caches):
        torch.testing.assert_close(glogits, logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(gfeats, feats, rtol=1e-5, atol=1e-5)
        for a, b in zip(cache.layers, gcache.layers):
            torch.testing.assert_close(b.keys, a.keys, rtol=1e-5, atol=1e-5)
    # next: a tree on the first sequence, one plain token on the second, the last row only of a third prefill
    verifier = HFVerifier(lean, tune_kernels=False)
    s0, s1 = verifier.start(PROMPTS[0]), verifier.start(PROMPTS[1])
    tree = build_tree(s0.tokens[-1], torch.tensor([[1, 2, 3], [1, 4, 5], [6, 2, 3]]))
    want0, want1 = s0.score(tree), s1.score(chain_of(s1.tokens[-1], []))
    b0, b1 = verifier.start(PROMPTS[0]), verifier.start(PROMPTS[1])
    m0, p0 = b0.tree_inputs(tree)
    chain = chain_of(b1.tokens[-1], [])
    m1, p1 = b1.tree_inputs(chain)
    third = lean.new_cache()
    out = lean.forward_ragged([Piece(tree.tokens, b0.cache, position_ids=p0, mask=m0),
                               Piece(chain.tokens, b1.cache, position_ids=p1, mask=m1),
                               Piece(torch.tensor(PROMPTS[3]), third, last=1)])
    torch.testing.assert_close(b0.scored(tree, *out[0]), want0, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(b1.scored(chain, *out[1]), want1, rtol=1e-5, atol=1e-5)
    assert out[2][0].shape[0] == 1 and third.get_seq_length() == len(PROMPTS[3])


def _decode_all(make, prompts, **kw):
    """Each prompt decoded in its own thread, all at once; results in prompt order."""
    out = [None] * len(prompts)
    errors = []

    def run(i):
        try:
            out[i] = make().generate(prompts[i], **kw)
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    return out


@pytest.mark.parametrize("spec", [SpecConfig(gamma=4, num_candidates=3), SpecConfig()], ids=["fixed", "adaptive"])
def test_concurrent_sessions_decode_what_each_decodes_alone_at_t0(lean, spec):
    verifier = HFVerifier(lean, tune_kernels=False)
    batched = BatchedVerifier(verifier)
    drafter = OracleDrafter(lean, confidence=0.6)
    costs = None
    if spec.adaptive:
        from specdiff.core.policy import SpeculationCosts

        costs = SpeculationCosts.affine(0.001, 0.01, 0.0005)
    alone = [SpeculativeDecoder(drafter, verifier, costs=costs).generate(p, max_new_tokens=24, spec=spec, seed=1)
             for p in PROMPTS]
    together = _decode_all(lambda: SpeculativeDecoder(drafter, batched, costs=costs), PROMPTS, max_new_tokens=24,
                           spec=spec, seed=1)
    for a, b in zip(alone, together):
        assert b.tokens == a.tokens
    assert batched.batcher.members == 0  # every session left when its decode ended
    assert batched.batcher.steps < sum(len(r.tokens) for r in together)  # passes did share steps


def test_seeded_sampling_is_independent_of_batch_mates(lean):
    """T>0 with fixed γ/K: each round draws from its own (seed, position) streams, so a session's tokens are those
    of its decode alone whoever it shares steps with."""
    verifier = HFVerifier(lean, tune_kernels=False)
    batched = BatchedVerifier(verifier)
    drafter = OracleDrafter(lean, confidence=0.5)
    spec = SpecConfig(gamma=3, num_candidates=2)
    sampling = SamplingParams(temperature=1.0)
    alone = [SpeculativeDecoder(drafter, verifier).generate(p, max_new_tokens=20, spec=spec, sampling=sampling,
                                                             seed=7) for p in PROMPTS]
    plain_alone = [generate_plain(verifier, p, max_new_tokens=20, sampling=sampling, seed=7) for p in PROMPTS]
    together = _decode_all(lambda: SpeculativeDecoder(drafter, batched), PROMPTS, max_new_tokens=20, spec=spec,
                           sampling=sampling, seed=7)
    assert [r.tokens for r in together] == [r.tokens for r in alone]
    # plain decodes batched with each other too
    out = [None] * len(PROMPTS)
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, generate_plain(
        batched, PROMPTS[i], max_new_tokens=20, sampling=sampling, seed=7))) for i in range(len(PROMPTS))]
    [t.start() for t in threads]
    [t.join(timeout=300) for t in threads]
    assert [r.tokens for r in out] == [r.tokens for r in plain_alone]


def test_feature_drafter_sessions_batch_with_their_taps(lean):
    drafter = build_feature_drafter(lean, num_layers=1, seed=0)
    verifier = HFVerifier(lean, tune_kernels=False, tap_layers=drafter.tap_layers)
    batched = BatchedVerifier(verifier)
    spec = SpecConfig(gamma=4, num_candidates=2)
    alone = [SpeculativeDecoder(drafter, verifier).generate(p, max_new_tokens=16, spec=spec, seed=3) for p in PROMPTS]
    together = _decode_all(lambda: SpeculativeDecoder(drafter, batched), PROMPTS, max_new_tokens=16, spec=spec,
                           seed=3)
    assert [r.tokens for r in together] == [r.tokens for r in alone]


def test_a_step_fires_when_every_session_waits_and_a_bad_request_fails_alone():
    seen = []

    def run(items):
        seen.append(list(items))
        if "bad" in items:
            raise ValueError("bad item")
        return [f"ok {x}" for x in items]

    batcher = StepBatcher(run, max_wait_s=5.0, max_delay_s=5.0)  # long waits: only "everyone waits" fires
    members = [batcher.join() for _ in range(3)]
    results = {}

    def submit(i, item):
        try:
            results[i] = batcher.submit(item, member=members[i])
        except ValueError as err:
            results[i] = err

    t0 = time.perf_counter()
    threads = [threading.Thread(target=submit, args=(i, x)) for i, x in enumerate(["a", "bad", "c"])]
    [t.start() for t in threads]
    [t.join(timeout=10) for t in threads]
    assert time.perf_counter() - t0 < 4  # did not wait for the deadline
    assert sorted(seen[0]) == ["a", "bad", "c"]  # one step for all three, then each alone
    assert results[0] == "ok a" and results[2] == "ok c" and isinstance(results[1], ValueError)
    # a member that left is not waited for; one that stays silent is waited for only until the deadline
    batcher.leave(members[1])
    quick = StepBatcher(lambda items: items, max_wait_s=0.05, max_delay_s=0.2)
    a, _silent = quick.join(), quick.join()
    t0 = time.perf_counter()
    assert quick.submit("x", member=a) == "x"
    assert 0.04 < time.perf_counter() - t0 < 2


def test_step_rows_are_capped():
    sizes = []
    batcher = StepBatcher(lambda items: (sizes.append(len(items)), items)[1], max_wait_s=0.2, max_delay_s=0.5,
                          max_rows=10)
    members = [batcher.join() for _ in range(3)]
    threads = [threading.Thread(target=batcher.submit, args=(i,), kwargs={"rows": 6, "member": m})
               for i, m in enumerate(members)]
    [t.start() for t in threads]
    [t.join(timeout=10) for t in threads]
    assert sizes and max(sizes) == 1  # 6 + 6 rows exceed the cap: one request per step


def test_decoder_replica_batches_its_decodes_and_a_client_that_leaves_frees_its_place(lean):
    from specdiff import DecodeOptions
    from specdiff.serving.servers import DecodeServer

    drafter = OracleDrafter(lean, confidence=0.6)
    server = DecodeServer((HFVerifier(lean, tune_kernels=False), drafter), max_decodes=8)
    assert server.info()["batching"]
    options = DecodeOptions(max_new_tokens=20, spec=SpecConfig(gamma=3, num_candidates=2), seed=0)
    alone = [SpeculativeDecoder(drafter, server.verifier).generate(p, options).tokens for p in PROMPTS]
    out = [None] * len(PROMPTS)

    def run(i):
        out[i] = [t for tokens, _ in server.stream(PROMPTS[i], options) for t in tokens]

    leaving = server.stream(PROMPTS[0], options)  # a client that reads one round, then goes away
    next(leaving)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(PROMPTS))]
    [t.start() for t in threads]
    time.sleep(0.05)
    leaving.close()  # between rounds: its session leaves the batch; the others must not wait for it
    [t.join(timeout=120) for t in threads]
    assert out == alone
    assert server.batched.batcher.members == 0 and server.load() == 0
    with pytest.raises(ValueError, match="token ids"):  # a bad prompt is refused before it joins any step
        list(server.stream([10**6], options))
    assert server.batched.batcher.members == 0


def test_verifier_replica_batches_concurrent_calls_per_call(lean):
    """Split placement: a Verifier replica's concurrent verify calls share steps; each returns what it returns alone."""
    from specdiff.core import rounds
    from specdiff.serving.servers import VerifierServer
    from specdiff.serving.wire import TokenSync

    plain = VerifierServer(HFVerifier(lean, tune_kernels=False))
    batched = VerifierServer(HFVerifier(lean, tune_kernels=False), batching=True)
    assert batched.info()["batching"] and not plain.info()["batching"]
    spec = SpecConfig(gamma=3, num_candidates=2)
    drafts = [rounds.Draft(torch.tensor([[1, 2, 3], [4, 5, 6]]) + i) for i in range(len(PROMPTS))]

    def call(server, i):
        return server.verify(f"s{i}", TokenSync.of(PROMPTS[i], full=True), drafts[i], SamplingParams(), spec, i)

    want = [call(plain, i).outcome.tokens for i in range(len(PROMPTS))]
    out = [None] * len(PROMPTS)
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, call(batched, i))) for i in range(len(PROMPTS))]
    [t.start() for t in threads]
    [t.join(timeout=60) for t in threads]
    assert [o.outcome.tokens for o in out] == want
    assert batched.verifier.batcher.steps <= 2 * len(PROMPTS)  # a prefill and a tree each, some shared


def test_drafter_windows_batched_equal_each_alone_and_extend_each_cache(lean):
    """``propose_many``: ragged contexts and windows of several decodes in one pass give each decode's own marginals,
    and leave each decode's context cache as its own ``propose`` would (the next call extends it)."""
    drafter = build_feature_drafter(lean, num_layers=1, seed=0)
    verifier = HFVerifier(lean, tune_kernels=False, tap_layers=drafter.tap_layers)
    sessions = [verifier.start(p) for p in PROMPTS]
    gammas = [1 + i % 4 for i in range(len(PROMPTS))]
    alone_views, batch_views = [drafter.open() for _ in PROMPTS], [drafter.open() for _ in PROMPTS]
    for grow in (0, 2):  # a first call (whole contexts), then one after the sessions grew by a few tokens
        for s in sessions:
            for _ in range(grow):
                s.score(chain_of(s.tokens[-1], []))
                s.commit([], 3)
        want = [v.propose(s.tokens, g, s.features) for v, s, g in zip(alone_views, sessions, gammas)]
        got = drafter.propose_many([(v, s.tokens, g, s.features) for v, s, g in zip(batch_views, sessions, gammas)])
        for w, g in zip(want, got):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
        for a, b in zip(alone_views, batch_views):
            assert a._tokens == b._tokens
            for (ka, va), (kb, vb) in zip(a._kv, b._kv):
                torch.testing.assert_close(kb, ka, rtol=1e-5, atol=1e-6)
                torch.testing.assert_close(vb, va, rtol=1e-5, atol=1e-6)


def test_decoder_replica_batches_feature_drafter_windows_exactly(lean):
    """A Decoder replica drafts its decodes' windows in batch steps that take turns with the verifier's: each
    decode's tokens are those of its decode alone, windows did share steps, and every decode left both batchers."""
    from specdiff import DecodeOptions
    from specdiff.models.batched import BatchedDrafter
    from specdiff.serving.servers import DecodeServer

    drafter = build_feature_drafter(lean, num_layers=1, seed=0)
    verifier = HFVerifier(lean, tune_kernels=False, tap_layers=drafter.tap_layers)
    server = DecodeServer((verifier, drafter), max_decodes=8)
    assert isinstance(server.batched_drafter, BatchedDrafter)
    options = DecodeOptions(max_new_tokens=16, spec=SpecConfig(gamma=3, num_candidates=2), seed=0)
    alone = [SpeculativeDecoder(drafter, verifier).generate(p, options).tokens for p in PROMPTS]
    sizes = []
    batcher = server.batched_drafter.batcher
    run = batcher._run
    batcher._run = lambda items: (sizes.append(len(items)), run(items))[1]
    out = [None] * len(PROMPTS)

    def decode(i):
        out[i] = [t for tokens, _ in server.stream(PROMPTS[i], options) for t in tokens]

    threads = [threading.Thread(target=decode, args=(i,)) for i in range(len(PROMPTS))]
    [t.start() for t in threads]
    [t.join(timeout=120) for t in threads]
    assert out == alone
    assert max(sizes) > 1 and len(sizes) < sum(len(o) for o in out)  # windows shared drafter steps
    assert batcher.members == 0 and server.batched.batcher.members == 0


def test_batchers_of_a_group_take_turns_and_fire_when_every_session_waits_in_one():
    """Two batchers the same sessions alternate between (``peer``): a step fires as soon as every session waits in
    one of them, never while the other's step runs, and the sessions of a step that ends are waited for."""
    running, overlap, steps = [], [], []

    def slow(tag):
        def run(items):
            if running:
                overlap.append(tag)
            running.append(tag)
            steps.append((tag, sorted(items)))
            time.sleep(0.2)
            running.remove(tag)
            return items
        return run

    verify = StepBatcher(slow("verify"), max_wait_s=5.0, max_delay_s=5.0)  # long waits: only "everyone waits" fires
    draft = StepBatcher(slow("draft"), max_wait_s=5.0, max_delay_s=5.0, peer=verify)
    one, two = (verify.join(), draft.join()), (verify.join(), draft.join())  # two sessions, a member of each

    def session_one():  # verifies, then drafts
        verify.submit("v1", member=one[0])
        draft.submit("d1", member=one[1])

    t0 = time.perf_counter()
    threads = [threading.Thread(target=session_one),
               threading.Thread(target=draft.submit, args=("d2",), kwargs={"member": two[1]})]
    threads[1].start()
    time.sleep(0.05)
    threads[0].start()
    [t.join(timeout=20) for t in threads]
    assert time.perf_counter() - t0 < 3  # never waited for a deadline
    assert not overlap
    # both waited (one in each): the verify step fired; the draft step waited for it and for its session
    assert steps == [("verify", ["v1"]), ("draft", ["d1", "d2"])]
    alone = StepBatcher(lambda items: items, max_wait_s=5.0, max_delay_s=0.3)
    alone.join(), alone.join()
    t0 = time.perf_counter()
    alone.submit("x", member=1)  # without a group the other member is waited for until the deadline
    assert time.perf_counter() - t0 > 0.25


def test_committed_features_grow_in_place_and_match_a_fresh_prefill(lean):
    """A session's tapped states grow in a buffer (no copy of the whole context per commit): after plain steps and
    a tree round they are those a prefill of the same tokens computes, and a view taken earlier stays as it was."""
    drafter = build_feature_drafter(lean, num_layers=1, seed=0)
    verifier = HFVerifier(lean, tune_kernels=False, tap_layers=drafter.tap_layers)
    session = verifier.start(PROMPTS[3])
    early = session.features
    snapshot = early.clone()
    ptrs = []
    for token in (5, 6, 7):
        session.score(chain_of(session.tokens[-1], []))
        session.commit([], token)
        ptrs.append(session.features.data_ptr())
    assert ptrs[1] == ptrs[2]  # the second and third commits wrote into spare rows: no copy of the context
    tree = build_tree(session.tokens[-1], torch.tensor([[9, 10, 11], [9, 12, 13]]))
    session.score(tree)
    path = tree.paths[1][:2].tolist()  # accepted 9, 12 (the second candidate's path): moved next to the root
    assert path == [1, 4]
    session.commit(path, 14)
    assert session.features.shape[0] == len(session.tokens) - 1
    torch.testing.assert_close(early, snapshot, rtol=0, atol=0)
    fresh = verifier.start(session.tokens)
    torch.testing.assert_close(session.features, fresh.features, rtol=1e-4, atol=1e-5)
    assert session.cached == len(session.tokens) - 1


def test_a_decode_never_started_holds_no_place_in_the_drafter_steps(lean):
    """A stream dropped before its first round (a client gone at once) never joined the drafter's batch steps."""
    from specdiff.models.batched import BatchedDrafter

    drafter = build_feature_drafter(lean, num_layers=1, seed=0)
    verifier = HFVerifier(lean, tune_kernels=False, tap_layers=drafter.tap_layers)
    batched = BatchedDrafter(drafter)
    decoder = SpeculativeDecoder(batched, BatchedVerifier(verifier))
    stream = decoder.stream(PROMPTS[0], max_new_tokens=4, spec=SpecConfig(gamma=2, num_candidates=1))
    stream.close()
    assert batched.batcher.members == 0
    out = decoder.generate(PROMPTS[1], max_new_tokens=4, spec=SpecConfig(gamma=2, num_candidates=1))
    assert len(out.tokens) == 4 and batched.batcher.members == 0
