"""Serving pieces as plain classes (no Ray cluster): configs, request parsing, KV-session cache, remote adapters."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
import torch
from ray import exceptions as ray_errors
from starlette.requests import Request

from serve_helpers import FakeHandle, LocalReference, SyncDrafter
from specdiff import SamplingParams, SpecConfig, SpeculativeDecoder
from specdiff.models.drafter import DrafterUnavailable
from specdiff.serving.app import CLIENT_LEFT, _unless_client_leaves
from specdiff.serving.config import AppConfig
from specdiff.serving.protocol import ApiError, ChatRequest, CompletionRequest, parse
from specdiff.serving.remote import RemoteDrafter, RemoteVerifier
from specdiff.serving.router import TextStreamer
from specdiff.serving.servers import DrafterServer, VerifierServer
from specdiff.core.tree import build_tree, chain


@pytest.fixture(scope="module")
def ref():
    return LocalReference()


def test_app_config_from_serve_run_args():
    cfg = AppConfig.from_args(
        {"drafter.max_replicas": "4", "drafter.min_replicas": "2", "pools": "true", "verifier.resources": '{"x": 2}'}
    )
    assert cfg.drafter.max_replicas == 4 and cfg.pools is True
    opts = cfg.drafter.deployment_options("drafter_pool")
    assert opts["autoscaling_config"] == {"min_replicas": 2, "max_replicas": 4, "target_ongoing_requests": 8.0}
    assert opts["ray_actor_options"]["resources"] == {"drafter_pool": 1}
    assert cfg.verifier.deployment_options("verifier_pool")["ray_actor_options"]["resources"] == {"x": 2, "verifier_pool": 1}
    assert AppConfig.from_args({}).drafter.deployment_options(None)["ray_actor_options"]["resources"] == {}


@pytest.mark.parametrize(
    "args,field",
    [
        ({"drafter.max_replicas": "0"}, "max_replicas"),
        ({"drafter.min_replicas": 3, "drafter.max_replicas": 2}, "min_replicas"),
        ({"drafter.replicas": 2}, "replicas"),
        ({"models.drafter": "import:nomodule"}, "drafter"),
    ],
)
def test_app_config_errors_name_the_field(args, field):
    with pytest.raises(ValueError, match=field):
        AppConfig.from_args(args)


@pytest.mark.parametrize(
    "body,param",
    [
        (b"{not json", "body"),
        (b"[1, 2]", "body"),
        (json.dumps({"model": "m"}).encode(), "prompt"),
        (json.dumps({"model": "m", "prompt": 5}).encode(), "prompt"),
        (json.dumps({"model": "m", "prompt": "x", "max_tokens": "5"}).encode(), "max_tokens"),
        (json.dumps({"model": "m", "prompt": "x", "max_tokens": 0}).encode(), "max_tokens"),
        (json.dumps({"model": "m", "prompt": "x", "temperature": "hot"}).encode(), "temperature"),
        (json.dumps({"model": "m", "prompt": "x", "stream": "yes"}).encode(), "stream"),
        (json.dumps({"model": "m", "prompt": "x", "n": 2}).encode(), "n"),
        (json.dumps({"model": "m", "prompt": "x", "gamma": 1.5}).encode(), "gamma"),
        (json.dumps({"model": "m", "prompt": "x", "bogus": 1}).encode(), "bogus"),
    ],
)
def test_parse_errors_name_the_field(body, param):
    with pytest.raises(ApiError) as err:
        parse(CompletionRequest, body)
    assert err.value.status == 400 and err.value.param == param, err.value.message
    assert err.value.body()["error"]["param"] == param


def test_parse_chat_errors():
    with pytest.raises(ApiError) as err:
        parse(ChatRequest, json.dumps({"model": "m", "messages": [{"role": "robot", "content": "x"}]}).encode())
    assert err.value.param == "messages.0.role"
    with pytest.raises(ApiError) as err:
        parse(ChatRequest, json.dumps({"model": "m", "messages": []}).encode())
    assert err.value.param == "messages"


def test_text_streamer_holds_back_stop_prefix_and_partial_utf8(ref):
    tok = ref.tokenizer
    ids = tok.encode("héllo END world", add_special_tokens=False)
    streamer = TextStreamer(ref.decode, ["END"])
    pieces = [streamer.push([t]) for t in ids]
    assert "".join(pieces) + streamer.push([], final=True) == "héllo "
    assert "\ufffd" not in "".join(pieces)
    plain = TextStreamer(ref.decode, [])
    assert "".join(plain.push([t]) for t in ids) + plain.push([], final=True) == "héllo END world"


def test_drafter_server_batch_equals_single(ref):
    server = DrafterServer(ref.drafter)
    prefixes, gammas = [[1, 2, 3], [5] * 9, [7, 8]], [4, 4, 2]
    batch = server.propose_many(prefixes, gammas)
    for p, g, m in zip(prefixes, gammas, batch):
        assert m.shape == (g, ref.drafter.vocab_size)
        torch.testing.assert_close(m, ref.drafter.propose(p, g), atol=1e-5, rtol=1e-4)
    assert server.batch_sizes == [3]


def test_verifier_server_hit_miss_and_lru(ref):
    server = VerifierServer(ref.verifier, max_sessions=2)
    prompt = [10, 20, 30]
    local = ref.verifier.start(prompt)
    tree = build_tree(prompt[-1], torch.tensor([[1, 2], [1, 3]]))
    torch.testing.assert_close(server.score("a", prompt, None, tree), local.score(tree))
    local.commit([1], 7)
    tokens = prompt + [1, 7]
    nxt = chain(7, [4])
    torch.testing.assert_close(server.score("a", tokens, ([1], 7), nxt), local.score(nxt), atol=1e-5, rtol=1e-4)
    assert server.counts["hits"] == 1 and server.counts["misses"] == 1
    # A replica that never saw session "b" recomputes from the tokens and gives the same scores.
    torch.testing.assert_close(server.score("b", tokens, ([1], 7), nxt), local_scores(ref, tokens, nxt), atol=1e-5, rtol=1e-4)
    server.score("c", [1, 2], None, chain(2, []))
    assert set(server.sessions()) == {"b", "c"} and server.counts["evictions"] == 1  # "a" was least recently used
    assert server.close("b") and not server.close("b")


def local_scores(ref, tokens, tree):
    return ref.verifier.start(tokens).score(tree)


def test_verifier_server_memory_budget(ref):
    server = VerifierServer(ref.verifier, kv_cache_budget_mb=0.01)  # ~10 KB: one 40-token session
    for sid in "abc":
        server.score(sid, list(range(1, 40)), None, chain(39, []))
    assert list(server.sessions()) == ["c"] and server.counts["evictions"] == 2


class _BlockingVerifier:
    """``ref.verifier`` whose sessions' ``score`` waits for ``go``: a call caught in flight."""

    def __init__(self, inner):
        self.inner, self.entered, self.go = inner, threading.Event(), threading.Event()
        self.vocab_size, self.max_context = inner.vocab_size, inner.max_context

    def start(self, tokens):
        session, outer = self.inner.start(tokens), self

        class Session:
            tokens = property(lambda _: session.tokens)
            cache = None

            def score(self, tree):
                outer.entered.set()
                assert outer.go.wait(30)
                return session.score(tree)

            def commit(self, path, token):
                session.commit(path, token)

        return Session()


@pytest.mark.parametrize("close_midway", [False, True])
def test_verifier_server_counts_sessions_in_flight(ref, close_midway):
    verifier = _BlockingVerifier(ref.verifier)
    server = VerifierServer(verifier)
    call = threading.Thread(target=server.score, args=("a", [10, 20, 30], None, chain(30, [1])))
    call.start()
    assert verifier.entered.wait(30)
    assert server.sessions() == {"a": 3}  # out of the LRU while in use, but live
    if close_midway:  # the client left during the call: the call must not put the session back
        assert server.close("a") and server.sessions() == {}
    verifier.go.set()
    call.join(30)
    assert server.sessions() == ({} if close_midway else {"a": 3})
    assert server._busy == {} and server._closed == set()


# The former defaults, fixed: these tests count calls per round (the adaptive policy would add calibration calls
# and plain steps).
FIXED = SpecConfig(gamma=8, num_candidates=4)


def _remote_decoder(ref, drafter_handle, verifier_handle, **verifier_options):
    drafter = RemoteDrafter(drafter_handle, ref.drafter.vocab_size, timeout_s=0.5, cooldown_s=0.0)
    verifier = RemoteVerifier(verifier_handle, ref.verifier.vocab_size, ref.verifier.max_context, **verifier_options)
    return SpeculativeDecoder(drafter, verifier), verifier


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_decode_over_handles_equals_local(ref, temperature):
    server = VerifierServer(ref.verifier)
    decoder, verifier = _remote_decoder(ref, FakeHandle(SyncDrafter(ref.drafter)), FakeHandle(server))
    prompt = ref.tokenizer.encode("Hello there", add_special_tokens=False)
    spec = SpecConfig(gamma=6, num_candidates=4)
    options = dict(max_new_tokens=40, sampling=SamplingParams(temperature=temperature), spec=spec, seed=3)
    remote = decoder.generate(prompt, **options)
    local = SpeculativeDecoder(ref.drafter, ref.verifier).generate(prompt, **options)
    assert remote.tokens == local.tokens and remote.stats.rounds == local.stats.rounds
    assert server.counts["misses"] == 1  # one prefill, then every round hit the cache
    verifier.close()
    assert server.sessions() == {}


def test_drafter_timeout_falls_back_exactly(ref):
    server = VerifierServer(ref.verifier)
    slow = FakeHandle(SyncDrafter(ref.drafter), delay_s=1.0)
    decoder, _ = _remote_decoder(ref, slow, FakeHandle(server))
    prompt = [72, 105]
    result = decoder.generate(prompt, max_new_tokens=5, sampling=SamplingParams(temperature=0), spec=FIXED, seed=0)
    from specdiff import generate_plain

    assert result.tokens == generate_plain(ref.verifier, prompt, max_new_tokens=5).tokens
    # The last token is a plain step anyway (no room for a window), so 4 of the 5 steps are fallbacks.
    assert result.stats.fallbacks == 4 and result.stats.rounds == 0 and result.stats.verifier_calls == 5


def test_drafter_cooldown_skips_calls(ref):
    handle = FakeHandle(SyncDrafter(ref.drafter), failures=[ray_errors.ActorDiedError()])
    drafter = RemoteDrafter(handle, ref.drafter.vocab_size, timeout_s=1.0, cooldown_s=60.0)
    for _ in range(3):
        with pytest.raises(DrafterUnavailable):
            drafter.propose([1, 2], 4)
    assert handle.calls == ["propose"]  # the two later rounds did not wait on a dead pool


def test_verifier_call_is_retried(ref):
    server = VerifierServer(ref.verifier)
    flaky = FakeHandle(server, failures=[ray_errors.ActorDiedError(), TimeoutError("slow")])
    decoder, _ = _remote_decoder(ref, FakeHandle(SyncDrafter(ref.drafter)), flaky, retries=2)
    prompt = [72, 105, 33]
    options = dict(max_new_tokens=12, sampling=SamplingParams(temperature=0), spec=FIXED, seed=0)
    got = decoder.generate(prompt, **options)
    want = SpeculativeDecoder(ref.drafter, ref.verifier).generate(prompt, **options)
    assert got.tokens == want.tokens
    assert flaky.calls.count("verify") == got.stats.verifier_calls + 2


def test_verifier_gives_up_after_retries(ref):
    flaky = FakeHandle(VerifierServer(ref.verifier), failures=[ray_errors.ActorDiedError()] * 3)
    decoder, _ = _remote_decoder(ref, FakeHandle(SyncDrafter(ref.drafter)), flaky, retries=2)
    with pytest.raises(ray_errors.ActorDiedError):
        decoder.generate([1, 2], max_new_tokens=4, spec=FIXED, seed=0)


def test_verifier_user_errors_are_not_retried(ref):
    flaky = FakeHandle(VerifierServer(ref.verifier), failures=[ValueError("bad tree")])
    decoder, _ = _remote_decoder(ref, FakeHandle(SyncDrafter(ref.drafter)), flaky, retries=2)
    with pytest.raises(ValueError, match="bad tree"):
        decoder.generate([1, 2], max_new_tokens=4, spec=FIXED, seed=0)
    assert flaky.calls.count("verify") == 1


# -- the Router's own disconnect watch (Serve's cancellation is best effort) -------------------------------------------


def _request(leave: asyncio.Event) -> Request:
    async def receive():
        await leave.wait()
        return {"type": "http.disconnect"}

    return Request({"type": "http", "method": "POST", "path": "/", "headers": []}, receive)


def test_client_leaving_cancels_the_work_even_without_serves_cancel():
    async def scenario():
        leave, cancelled = asyncio.Event(), asyncio.Event()

        async def decode():  # a decode that would outlive the client by far
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        asyncio.get_running_loop().call_later(0.05, leave.set)
        result = await asyncio.wait_for(_unless_client_leaves(decode(), _request(leave)), 10)
        return result, cancelled.is_set()

    result, cancelled = asyncio.run(scenario())
    assert result is CLIENT_LEFT and cancelled


def test_finished_work_is_returned_and_the_watch_stops():
    async def scenario():
        leave = asyncio.Event()

        async def decode():
            await asyncio.sleep(0.01)
            return {"choices": []}

        result = await _unless_client_leaves(decode(), _request(leave))
        await asyncio.sleep(0)
        pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        return result, pending

    result, pending = asyncio.run(scenario())
    assert result == {"choices": []} and pending == []


def test_work_errors_pass_through_and_a_broken_watch_does_not_cancel():
    async def broken_receive():
        raise RuntimeError("receive failed")

    async def scenario():
        async def decode():
            await asyncio.sleep(0.05)
            return "done"

        async def failing():
            raise ApiError("bad", param="x")

        request = Request({"type": "http", "method": "POST", "path": "/", "headers": []}, broken_receive)
        ok = await _unless_client_leaves(decode(), request)
        with pytest.raises(ApiError):
            await _unless_client_leaves(failing(), _request(asyncio.Event()))
        return ok

    assert asyncio.run(scenario()) == "done"


def test_serves_own_cancellation_still_stops_the_work():
    async def scenario():
        cancelled = asyncio.Event()

        async def decode():
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        outer = asyncio.ensure_future(_unless_client_leaves(decode(), _request(asyncio.Event())))
        await asyncio.sleep(0.05)
        outer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await outer
        await asyncio.sleep(0.01)
        return cancelled.is_set()

    assert asyncio.run(scenario())


def _consume(merge, fail: bool = False, slow_s: float = 0.05):
    """Items 0..5 made at once in a worker thread, consumed slowly; -> what the consumer got (and its error)."""
    import time

    from specdiff.serving.aio import iterate_in_thread

    def produce():
        for i in range(6):
            yield [i]
        if fail:
            raise ValueError("broke after six")

    async def main():
        got = []
        try:
            async for item in iterate_in_thread(produce(), merge=merge):
                got.append(item)
                time.sleep(slow_s)  # a busy consumer (the event loop blocked a while): the rest queue up
        except ValueError as err:
            return got, err
        return got, None

    return asyncio.run(main())


def test_items_that_queue_up_go_on_merged_in_order():
    got, err = _consume(lambda a, b: a + b)
    assert err is None and [t for item in got for t in item] == list(range(6)) and len(got) < 6
    got, err = _consume(lambda a, b: a + b, fail=True)  # the failure comes after the merged items
    assert isinstance(err, ValueError) and [t for item in got for t in item] == list(range(6))
    got, _ = _consume(None)  # no merge: one item each
    assert got == [[i] for i in range(6)]
