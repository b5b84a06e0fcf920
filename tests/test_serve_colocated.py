"""``colocate=true``: one replica holds both models and runs whole decodes (``DecodeServer``), the router receives
tokens. Plain-class tests of the server and of the router's side (``remote_decode``: stop strings, resume after a
dead replica), then the Serve app end to end with the demo pair."""

from __future__ import annotations

import asyncio
import json
import pickle
import time

import pytest
import requests
from ray import exceptions as ray_errors

from serve_helpers import BASE, DEMO, MODEL, LocalReference, run_app
from specdiff import DecodeOptions, SamplingParams, SpecConfig, SpeculativeDecoder
from specdiff.serving.remote import remote_decode
from specdiff.serving.servers import DecodeServer, _merge_rounds

FIXED = SpecConfig(gamma=6, num_candidates=3)


@pytest.fixture(scope="module")
def ref():
    return LocalReference()


@pytest.fixture(scope="module")
def server(ref):
    return DecodeServer((ref.verifier, ref.drafter), max_decodes=4)


def _options(ref, **fields):
    base = dict(max_new_tokens=40, sampling=SamplingParams(temperature=1.0), spec=FIXED, seed=3,
                stop_token_ids=[ref.tokenizer.eos_token_id])
    return DecodeOptions(**{**base, **fields})


def _ids(ref, text):
    return ref.tokenizer.encode(text, add_special_tokens=False)


class _Stream:
    """A streaming handle call over the server's blocking ``stream`` (what Serve's generator delivers); ``fail_after``
    items, it raises as a dead replica's stream does."""

    def __init__(self, items, fail_after=None):
        self.items, self.fail_after, self.cancelled, self.sent = items, fail_after, False, 0

    def __iter__(self):
        for item in self.items:
            if self.fail_after is not None and self.sent == self.fail_after:
                self.items.close()
                raise ray_errors.ActorDiedError()
            self.sent += 1
            yield item

    def cancel(self):
        self.cancelled = True
        self.items.close()


class StreamHandle:
    def __init__(self, server, fails=()):
        self.server, self.fails, self.calls = server, list(fails), []

    def options(self, stream=False, **_):
        assert stream
        return self

    @property
    def decode(self):
        handle = self

        class _Method:
            def remote(self, prompt, options, speculative, max_load):
                handle.calls.append((list(prompt), options))
                fail = handle.fails.pop(0) if handle.fails else None
                call = _Stream(handle.server.stream(prompt, options, speculative, max_load), fail)
                handle.last = call
                return call

        return _Method()


def test_server_decode_equals_in_process(ref, server):
    """The replica runs the in-process engine: same tokens and stats for a seeded T>0 decode at a fixed γ/K."""
    prompt, options = _ids(ref, "The quick brown fox"), _options(ref)
    want = SpeculativeDecoder(ref.drafter, ref.verifier).generate(prompt, options)
    items = list(server.stream(prompt, options))
    assert [t for chunk, _ in items for t in chunk][: len(want.tokens)] == want.tokens
    assert items[-1][1].rounds == want.stats.rounds and items[-1][1].accepted == want.stats.accepted
    assert server.load() == 0
    # What travels per round (one streamed item): the round's tokens and the stats snapshot, well under 64 KB.
    assert max(len(pickle.dumps(item)) for item in items) < 4096
    # Guard: the seed matters, so equal tokens are not a coincidence.
    other = SpeculativeDecoder(ref.drafter, ref.verifier).generate(prompt, options, seed=4)
    assert other.tokens != want.tokens


def test_async_decode_streams_and_stops_when_the_caller_leaves(ref, server):
    prompt = _ids(ref, "Hello")

    async def consume(n):
        out, agen = [], server.decode(prompt, _options(ref, max_new_tokens=200, spec=SpecConfig(gamma=2,
                                                                                            num_candidates=1)))
        async for tokens, _ in agen:
            out.append(tokens)
            if len(out) == n:
                await agen.aclose()
                break
        return out

    assert len(asyncio.run(consume(2))) == 2
    deadline = time.monotonic() + 10
    while server.load() and time.monotonic() < deadline:  # the worker stops after its round in progress
        time.sleep(0.01)
    assert server.load() == 0


def test_remote_decode_equals_in_process_and_resumes_after_a_dead_replica(ref, server):
    prompt = _ids(ref, "Once upon a time")
    options = _options(ref, sampling=SamplingParams(temperature=0.0), max_new_tokens=48)
    want = SpeculativeDecoder(ref.drafter, ref.verifier).generate(prompt, options)
    assert remote_decode(StreamHandle(server), prompt, options).run().tokens == want.tokens
    handle = StreamHandle(server, fails=[3, 1])  # two replicas die mid-decode; the third finishes it
    result = remote_decode(handle, prompt, options, retries=2).run()
    assert result.tokens == want.tokens and result.finish_reason == want.finish_reason
    assert len(handle.calls) == 3
    resumed_prompt, resumed = handle.calls[1]
    assert resumed_prompt[: len(prompt)] == prompt and len(resumed_prompt) > len(prompt)  # prompt + emitted
    assert resumed.max_new_tokens == 48 - (len(resumed_prompt) - len(prompt))
    assert result.stats.emitted >= len(want.tokens)  # the dead attempts' rounds are counted too
    with pytest.raises(ray_errors.ActorDiedError):
        remote_decode(StreamHandle(server, fails=[1, 1]), prompt, options, retries=1).run()


def test_remote_decode_applies_stop_strings_here_and_cancels_the_replica(ref, server):
    prompt = _ids(ref, "The quick brown fox")
    options = _options(ref, sampling=SamplingParams(temperature=0.0), max_new_tokens=60)
    full = SpeculativeDecoder(ref.drafter, ref.verifier).generate(prompt, options)
    text = ref.decode(full.tokens)
    stop = text[len(text) // 3: len(text) // 3 + 2]
    assert stop.strip(), text
    want = SpeculativeDecoder(ref.drafter, ref.verifier, decode=ref.decode).generate(prompt, options,
                                                                                  stop_strings=(stop,))
    handle = StreamHandle(server)
    got = remote_decode(handle, prompt, DecodeOptions.merge(options, {"stop_strings": (stop,)}),
                        decode=ref.decode).run()
    assert got.tokens == want.tokens and got.finish_reason == "stop"
    assert handle.calls[0][1].stop_strings == ()  # the replica decodes without them: it needs no tokenizer
    assert handle.last.cancelled


class _MergingHandle(StreamHandle):
    """Streams the replica's rounds two at a time, as its stream does when the reader falls behind (merged)."""

    @property
    def decode(self):
        handle = self

        class _Method:
            def remote(self, prompt, options, speculative, max_load):
                items = handle.server.stream(prompt, options, speculative, max_load)
                merged = _pairs(items)
                handle.last = _Stream(merged)
                return handle.last

        return _Method()


def _pairs(items):
    try:
        for first in items:
            second = next(items, None)
            yield first if second is None else _merge_rounds(first, second)
    finally:
        items.close()


def test_router_histogram_counts_every_verifier_call_of_merged_rounds(ref, server):
    """The router's acceptance-length metric sees one value per verifier call, also where the replica's rounds
    arrive merged (two calls in one item): the same values as the decode's own per-call counts."""
    from types import SimpleNamespace

    from specdiff.serving.router import _Run

    seen = []
    metrics = SimpleNamespace(acceptance_length=seen.append)
    prompt = _ids(ref, "Once upon a time")
    options = _options(ref, sampling=SamplingParams(temperature=0.0), max_new_tokens=48)
    stream = remote_decode(_MergingHandle(server), prompt, options)
    router = SimpleNamespace(metrics=metrics, _decode=ref.decode)
    run = _Run(router, stream, SimpleNamespace(stop_strings=()), prompt, False, True)
    chunks = list(run._produce())
    stats = stream.stats
    assert len(chunks) < stats.verifier_calls  # the rounds did arrive merged
    assert len(seen) == stats.verifier_calls and sum(seen) == stats.emitted
    assert sorted(seen) == sorted(n for n, c in enumerate(stats.calls_by_emitted) for _ in range(c))
    assert max(seen) > 1  # speculation accepted something: the values are not all plain steps


# -- the Serve app ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def app(serve_cluster):
    from specdiff.serving.app import build_app

    small = {"num_cpus": 0.5}
    run_app(build_app({"models": DEMO, "colocate": True, "verifier": small, "router": small}), "colo", "/colo")
    yield BASE + "/colo"
    serve_cluster.delete("colo")


def _post(url, body, **kw):
    return requests.post(url + "/v1/completions", json={"model": MODEL, "max_tokens": 40, **body}, timeout=120, **kw)


@pytest.mark.slow
def test_served_equals_in_process(app, ref, serve_cluster):
    from ray import serve

    assert set(serve.status().applications["colo"].deployments) == {"Router", "Decoder"}
    for prompt, temperature, seed in [("Hello", 0.0, 0), ("def f(x):", 1.0, 7)]:
        out = _post(app, {"prompt": prompt, "temperature": temperature, "seed": seed, "gamma": 6,
                          "num_candidates": 3}).json()
        text, result = ref.complete(prompt, max_tokens=40, temperature=temperature, seed=seed, gamma=6, k=3)
        assert out["choices"][0]["text"] == text
        spec = out["usage"]["speculative"]
        assert spec["rounds"] == result.stats.rounds and spec["accepted"] == result.stats.accepted
    # streamed, chat-free plain request and the adaptive default (greedy: the verifier's own text)
    body = {"prompt": "The quick brown fox", "temperature": 1.0, "seed": 5, "gamma": 8, "num_candidates": 4,
            "stream": True, "stream_options": {"include_usage": True}}
    with _post(app, body, stream=True) as response:
        events = [json.loads(line[6:]) for line in response.iter_lines()
                  if line.startswith(b"data: ") and line != b"data: [DONE]"]
    text, result = ref.complete("The quick brown fox", max_tokens=40, temperature=1.0, seed=5)
    assert "".join(e["choices"][0]["text"] for e in events if e["choices"]) == text
    assert events[-1]["usage"]["completion_tokens"] == len(result.tokens)
    out = _post(app, {"prompt": "1 2 3 4", "temperature": 1.0, "seed": 4, "speculative": False}).json()
    assert out["choices"][0]["text"] == ref.complete("1 2 3 4", max_tokens=40, temperature=1.0, seed=4,
                                                     speculative=False)[0]
    out = _post(app, {"prompt": "Once upon a time", "temperature": 0.0}).json()
    assert out["choices"][0]["text"] == ref.complete("Once upon a time", max_tokens=40, temperature=0.0, seed=0,
                                                     speculative=False)[0]


@pytest.mark.slow
def test_client_leaving_stops_the_decode_on_the_replica(app, serve_cluster):
    decoder = serve_cluster.get_deployment_handle("Decoder", app_name="colo")
    body = {"prompt": "x" * 10, "max_tokens": 4000, "temperature": 0.0, "stream": True, "gamma": 8,
            "num_candidates": 4}  # greedy runs past 300 tokens here (test_serve_app.test_long_prompt_really_runs_long)
    response = _post(app, body, stream=True)
    lines = response.iter_lines()
    assert next(line for line in lines if line.startswith(b"data: "))
    deadline = time.monotonic() + 30  # the replica's decode is running (it streamed a round already)
    while decoder.load.remote().result(timeout_s=30) != 1 and time.monotonic() < deadline:
        next(lines)
    assert decoder.load.remote().result(timeout_s=30) == 1
    response.close()
    deadline = time.monotonic() + 60
    while decoder.load.remote().result(timeout_s=30) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert decoder.load.remote().result(timeout_s=30) == 0


def test_decoder_replica_keeps_its_cost_model_for_the_next_replica(tmp_path, monkeypatch):
    """The first adaptive decode measures the cost model once and keeps it in ``costs_cache``; a later replica on
    the same machine and models reads it instead of measuring while requests wait."""
    from specdiff import DecodeOptions, HFVerifier
    from specdiff.core import policy
    from specdiff.serving.servers import DecodeServer, _merge_rounds
    from test_llama import save_tiny
    from specdiff.models.llama import load_llama
    from specdiff.models.feature_drafter import build_feature_drafter

    lean = load_llama(save_tiny(tmp_path / "tiny"))
    drafter = build_feature_drafter(lean, num_layers=1, seed=0)
    verifier = HFVerifier(lean, tune_kernels=False, tap_layers=drafter.tap_layers)
    measured = []
    real = policy.calibrate
    monkeypatch.setattr(policy, "calibrate", lambda *a, **k: measured.append(1) or real(*a, **k))
    options = DecodeOptions(max_new_tokens=4, seed=0)
    first = DecodeServer((verifier, drafter), costs_cache=tmp_path / "costs")
    list(first.stream([5, 9, 2, 7], options))
    second = DecodeServer((verifier, drafter), costs_cache=tmp_path / "costs")
    list(second.stream([5, 9, 2, 7], options))
    assert len(measured) == 1 and second.costs == first.costs and list((tmp_path / "costs").iterdir())


def test_decoder_replica_measures_its_cost_model_before_traffic(tmp_path, monkeypatch):
    """``warm_costs`` (the Serve replica calls it at start) measures and keeps the cost model, so the first adaptive
    decode does not measure; the app passes the router's adaptive bounds, and none where γ and K are fixed."""
    from specdiff import DecodeOptions, HFVerifier
    from specdiff.core import policy
    from specdiff.serving.app import _adaptive_bounds
    from specdiff.serving.config import RouterOptions
    from test_llama import save_tiny
    from specdiff.models.llama import load_llama
    from specdiff.models.feature_drafter import build_feature_drafter

    lean = load_llama(save_tiny(tmp_path / "tiny"))
    drafter = build_feature_drafter(lean, num_layers=1, seed=0)
    verifier = HFVerifier(lean, tune_kernels=False, tap_layers=drafter.tap_layers)
    measured = []
    real = policy.calibrate
    monkeypatch.setattr(policy, "calibrate", lambda *a, **k: measured.append(a[3:5]) or real(*a, **k))
    server = DecodeServer((verifier, drafter), costs_cache=tmp_path / "costs")
    bounds = _adaptive_bounds(RouterOptions())
    costs = server.warm_costs(*bounds)
    assert measured == [bounds] and server.costs is costs and list((tmp_path / "costs").iterdir())
    list(server.stream([5, 9, 2, 7], DecodeOptions(max_new_tokens=4, seed=0)))
    assert len(measured) == 1 and server.costs is costs
    assert _adaptive_bounds(RouterOptions(gamma=4, num_candidates=1)) is None
    assert _adaptive_bounds(RouterOptions(adaptive_max_gamma=6, max_candidates=2)) == (6, 2)


def test_decoder_replica_admits_decodes_within_its_kv_budget(ref):
    """With ``kv_budget_mb``, a decode waits until its room (prompt + max_tokens + tree) fits beside the decodes
    running, and one that could never fit is refused with a 503 naming the limit; the router refuses it up front."""
    from specdiff.serving.protocol import ApiError
    from specdiff.serving.wire import room_error, room_needed

    options = _options(ref, sampling=SamplingParams(temperature=0.0), max_new_tokens=24)
    prompt = _ids(ref, "Once upon a time")
    probe = DecodeServer((ref.verifier, ref.drafter), kv_budget_mb=1)
    need = room_needed(len(prompt), options, True)
    assert need == len(prompt) + 24 + 6 * 3 + 1 and probe.token_bytes > 0
    mb = 1.5 * need * probe.token_bytes / 2**20  # room for one such decode, not two
    server = DecodeServer((ref.verifier, ref.drafter), kv_budget_mb=mb)
    assert server.info()["kv_budget_tokens"] == server.budget_tokens and need <= server.budget_tokens < 2 * need
    events = []

    async def one(name):
        async for tokens, _ in server.decode(prompt, options):
            events.append(name)
        events.append(name + " done")

    async def both():
        await asyncio.gather(one("a"), one("b"))

    asyncio.run(both())
    a_done = events.index("a done")
    assert "b" not in events[:a_done] and events.count("b") > 1  # b waited for a's room, then decoded in full
    assert server._reserved == 0

    big = _options(ref, sampling=SamplingParams(temperature=0.0), max_new_tokens=2 * server.budget_tokens)

    async def refused():
        async for _ in server.decode(prompt, big):
            pass

    with pytest.raises(ApiError, match="kv_cache_budget_mb") as err:
        asyncio.run(refused())
    assert err.value.status == 503
    info = server.info()
    message = room_error(room_needed(len(prompt), big, True), info["kv_budget_tokens"], info["kv_budget_mb"],
                         info["token_bytes"])
    assert message is not None and "holds at most" in message
    assert room_error(need, info["kv_budget_tokens"], info["kv_budget_mb"], info["token_bytes"]) is None


def test_a_pooled_decoder_admits_by_count_times_the_longest_room(ref, tmp_path):
    """Batch steps over a KV pool give every slot the longest decode's room: two decodes whose rooms sum within the
    budget, but not twice the longer, run one after the other there, and side by side without the pool."""
    from test_llama import save_tiny

    from specdiff.models.llama import load_llama
    from specdiff.models.verifier import HFVerifier
    from specdiff.serving.wire import room_needed

    lean = HFVerifier(load_llama(save_tiny(tmp_path / "tiny")), tune_kernels=False)
    short = _options(ref, sampling=SamplingParams(temperature=0.0), max_new_tokens=8, spec=SpecConfig(gamma=2,
                     num_candidates=1), stop_token_ids=[])
    long = _options(ref, sampling=SamplingParams(temperature=0.0), max_new_tokens=40, spec=SpecConfig(gamma=2,
                    num_candidates=1), stop_token_ids=[])
    prompt = _ids(ref, "Once upon a time")
    probe = DecodeServer((lean, ref.drafter), kv_budget_mb=1)
    need_short, need_long = (room_needed(len(prompt), o, True) for o in (short, long))
    mb = (need_short + need_long + 2) * probe.token_bytes / 2**20  # the sum fits; twice the longer does not

    def overlapped(batching):
        server = DecodeServer((lean, ref.drafter), kv_budget_mb=mb, batching=batching)
        assert (getattr(server.batched, "pool", None) is not None) == batching
        assert need_short + need_long <= server.budget_tokens < 2 * need_long
        events = []

        async def one(name, options):
            async for _ in server.decode(prompt, options):
                events.append(name)
            events.append(name + " done")

        async def both():
            await asyncio.gather(one("long", long), one("short", short))

        asyncio.run(both())
        assert server._reserved == 0
        return "short" in events[: events.index("long done")]

    assert not overlapped(True)  # pooled: the short decode waited for the long one's room
    assert overlapped(False)  # per-session caches: both ran at once
