"""The Serve app end to end on CPU with the tiny demo models: equality with the local engine, concurrency, the
OpenAI client, bad input, client disconnects, metrics."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from serve_helpers import BASE, DEMO, METRICS_PORT, MODEL, LocalReference, run_app

pytestmark = pytest.mark.slow
PROMPTS = ["Hello", "The quick brown fox", "def f(x):", "Once upon a time, far away", "1 2 3 4"]
SMALL = {"num_cpus": 0.5}
# The local reference's fixed window and K: a seeded T>0 request equals the in-process decode at a fixed γ/K. A request
# that names neither runs the adaptive policy with the router's measured costs (test_default_request_is_adaptive).
FIXED = {"gamma": 8, "num_candidates": 4}


@pytest.fixture(scope="module")
def app(serve_cluster):
    from specdiff.serving.app import build_app

    # speculation_max_load: the 40 concurrent requests below run over it, the one-at-a-time ones never.
    router = {**SMALL, "speculation_max_load": 8}
    run_app(build_app({"models": DEMO, "drafter": SMALL, "verifier": SMALL, "router": router}), "specdiff", "/")
    yield BASE
    serve_cluster.delete("specdiff")


@pytest.fixture(scope="module")
def ref():
    return LocalReference()


def post(path, body, timeout=120):
    return requests.post(BASE + path, json=body, timeout=timeout)


def completion(prompt, **extra):
    return {"model": MODEL, "prompt": prompt, "max_tokens": 40, **extra}


def sse_events(response):
    events = []
    for line in response.iter_lines():
        if line.startswith(b"data: "):
            payload = line[len(b"data: ") :]
            events.append("[DONE]" if payload == b"[DONE]" else json.loads(payload))
    return events


def test_health_and_models(app):
    assert requests.get(BASE + "/health", timeout=30).json()["status"] == "ok"
    assert [m["id"] for m in requests.get(BASE + "/v1/models", timeout=30).json()["data"]] == [MODEL]


@pytest.mark.parametrize("temperature,seed", [(0.0, 0), (1.0, 7), (0.7, 11)])
def test_completion_equals_local_engine(app, ref, temperature, seed):
    for prompt in PROMPTS[:3]:
        body = post("/v1/completions", completion(prompt, temperature=temperature, seed=seed, gamma=6, num_candidates=3)).json()
        text, result = ref.complete(prompt, max_tokens=40, temperature=temperature, seed=seed, gamma=6, k=3)
        assert body["choices"][0]["text"] == text
        usage = body["usage"]
        assert usage["completion_tokens"] == len(result.tokens)
        spec = usage["speculative"]
        assert spec["rounds"] == result.stats.rounds and spec["accepted"] == result.stats.accepted
        assert spec["accepted_per_position"] == result.stats.accepted_per_position
        assert spec["tau"] == pytest.approx(result.stats.tau, abs=1e-4)
        if temperature > 0:  # guards the test: the seed matters, so equal text is not a coincidence
            assert text != ref.complete(prompt, max_tokens=40, temperature=temperature, seed=seed + 1, gamma=6, k=3)[0]


def test_stream_equals_local_engine(app, ref):
    body = completion(PROMPTS[1], temperature=1.0, seed=5, stream=True, stream_options={"include_usage": True},
                      **FIXED)
    with requests.post(BASE + "/v1/completions", json=body, stream=True, timeout=120) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response)
    assert events[-1] == "[DONE]"
    usage = events[-2]["usage"]
    chunks = [e for e in events[:-2]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    text, result = ref.complete(PROMPTS[1], max_tokens=40, temperature=1.0, seed=5)
    assert "".join(c["choices"][0]["text"] for c in chunks) == text
    assert usage["completion_tokens"] == len(result.tokens) and usage["speculative"]["rounds"] == result.stats.rounds


def test_chat_equals_local_engine(app, ref):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi there"}], "max_tokens": 30, "seed": 2, **FIXED}
    out = post("/v1/chat/completions", body).json()
    text, _ = ref.complete("hi there", max_tokens=30, temperature=1.0, seed=2, chat=True)
    assert out["object"] == "chat.completion" and out["choices"][0]["message"] == {"role": "assistant", "content": text}


def test_default_request_is_adaptive_and_exact(app, ref):
    """No gamma/num_candidates: the router's adaptive policy (costs measured through the replicas by the first such
    request, then shared) picks plain steps or rounds; at T=0 the text is the verifier's greedy text all the same."""
    for prompt in PROMPTS[:2]:
        out = post("/v1/completions", completion(prompt, temperature=0.0, seed=0)).json()
        text, _ = ref.complete(prompt, max_tokens=40, temperature=0.0, seed=0, speculative=False)
        assert out["choices"][0]["text"] == text
        choices = out["usage"]["speculative"]["choices"]
        assert sum(n for c, n in choices.items() if c == "plain" or c.startswith("gamma=")) > 0, choices


def test_plain_decoding_request(app, ref):
    out = post("/v1/completions", completion(PROMPTS[0], temperature=1.0, seed=4, speculative=False)).json()
    text, _ = ref.complete(PROMPTS[0], max_tokens=40, temperature=1.0, seed=4, speculative=False)
    assert out["choices"][0]["text"] == text and out["usage"]["speculative"]["rounds"] == 0


def test_concurrent_requests_all_correct(app, ref):
    jobs = [(PROMPTS[i % len(PROMPTS)] + f" #{i}", i) for i in range(40)]
    # Greedy: exact regardless of how the drafter batches (batched marginals differ from single ones in float noise).
    want = {i: ref.complete(p, max_tokens=24, temperature=0.0, seed=i)[0] for p, i in jobs}
    t0 = time.perf_counter()
    with ThreadPoolExecutor(40) as pool:
        outs = list(pool.map(lambda j: post("/v1/completions", completion(j[0], max_tokens=24, temperature=0.0, seed=j[1])), jobs))
    elapsed = time.perf_counter() - t0
    assert [o.status_code for o in outs] == [200] * 40
    assert [o.json()["choices"][0]["text"] for o in outs] == [want[i] for _, i in jobs]
    # Over router.speculation_max_load sessions on the verifier replica, decodes took plain steps (exact all the same).
    busy = [o.json()["usage"]["speculative"]["choices"].get("busy_plain", 0) for o in outs]
    assert sum(busy) > 0, busy
    print(f"40 concurrent requests in {elapsed:.1f}s; plain steps under load: {sum(busy)}")


def test_openai_client(app, ref):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0, timeout=120)
    assert [m.id for m in client.models.list().data] == [MODEL]
    out = client.completions.create(
        model=MODEL, prompt=PROMPTS[2], max_tokens=40, temperature=0.7, seed=3, extra_body={"gamma": 4, "num_candidates": 2}
    )
    text, result = ref.complete(PROMPTS[2], max_tokens=40, temperature=0.7, seed=3, gamma=4, k=2)
    assert out.choices[0].text == text
    assert out.usage.completion_tokens == len(result.tokens)
    assert out.usage.model_extra["speculative"]["accepted_per_position"] == result.stats.accepted_per_position
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi there"}], max_tokens=30, seed=2, extra_body=FIXED
    )
    assert chat.choices[0].message.content == ref.complete("hi there", max_tokens=30, temperature=1.0, seed=2, chat=True)[0]
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi there"}], max_tokens=30, seed=2, stream=True,
        extra_body=FIXED,
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == chat.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt="x", max_tokens=4, extra_body={"num_candidates": 0})
    assert err.value.body["param"] == "num_candidates"


BAD = [
    ("/v1/completions", b"{not json", "body"),
    ("/v1/completions", completion(""), "prompt"),
    ("/v1/completions", completion([]), "prompt"),
    ("/v1/completions", completion([10_000]), "prompt"),
    ("/v1/completions", completion("x" * 1100), "prompt"),  # > the demo's 1024-token context
    ("/v1/completions", completion("x", model="gpt-9"), "model"),
    ("/v1/completions", completion("x", temperature=-1), "temperature"),
    ("/v1/completions", completion("x", top_p=0), "top_p"),
    ("/v1/completions", completion("x", top_k=-3), "top_k"),
    ("/v1/completions", completion("x", max_tokens=10**6), "max_tokens"),
    ("/v1/completions", completion("x", max_tokens="10"), "max_tokens"),
    ("/v1/completions", completion("x", gamma=0), "gamma"),
    ("/v1/completions", completion("x", gamma=65), "gamma"),
    ("/v1/completions", completion("x", num_candidates=100), "num_candidates"),
    ("/v1/completions", completion("x", draft_temperature=-0.5), "draft_temperature"),
    ("/v1/completions", completion("x", stop=[""]), "stop"),
    ("/v1/completions", completion("x", stream=1), "stream"),
    ("/v1/completions", completion("x", unknown_field=1), "unknown_field"),
    ("/v1/chat/completions", {"model": MODEL, "messages": "hi"}, "messages"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user"}]}, "messages.0.content"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": ""}]}, "messages"),
]


@pytest.mark.parametrize("path,body,param", BAD, ids=[f"{b[2]}-{i}" for i, b in enumerate(BAD)])
def test_bad_input_is_400_naming_the_field(app, path, body, param):
    if isinstance(body, bytes):
        response = requests.post(BASE + path, data=body, headers={"content-type": "application/json"}, timeout=60)
    else:
        response = post(path, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error", error
    assert param.split(".")[0] in error["message"] or param == "body"


def test_server_keeps_serving_after_bad_input(app):
    for path, body, _ in BAD[:5]:
        requests.post(BASE + path, json=body if not isinstance(body, bytes) else None, timeout=60)
    assert post("/v1/completions", completion("still alive", max_tokens=5)).status_code == 200


def _wait_no_sessions(verifier, seconds):
    deadline = time.monotonic() + seconds
    while verifier.sessions.remote().result(timeout_s=30) and time.monotonic() < deadline:
        time.sleep(0.2)
    return verifier.sessions.remote().result(timeout_s=30) == {}


LONG = "x" * 10  # greedy continuation of this prompt runs past 300 tokens (checked below): the decode outlives the client


def test_long_prompt_really_runs_long(ref):
    _, result = ref.complete(LONG, max_tokens=300, temperature=0.0, seed=0, speculative=False)
    assert result.finish_reason == "length"


def test_client_disconnect_frees_session_streaming(app, serve_cluster):
    verifier = serve_cluster.get_deployment_handle("Verifier", app_name="specdiff")
    assert _wait_no_sessions(verifier, 30)
    body = completion(LONG, max_tokens=1000, stream=True, temperature=0.0, **FIXED)  # as below: a long decode
    response = requests.post(BASE + "/v1/completions", json=body, stream=True, timeout=60)
    assert next(line for line in response.iter_lines() if line.startswith(b"data: "))
    assert len(verifier.sessions.remote().result(timeout_s=30)) == 1  # the decode is running
    response.close()  # the client goes away mid-stream
    # The router notices at its next write; on a loaded machine a round can take seconds, so allow a minute.
    assert _wait_no_sessions(verifier, 60)


def test_client_disconnect_frees_session_non_streaming(app, serve_cluster):
    """Event-driven: the client leaves once the decode is seen running on the verifier replica, not after a fixed
    timeout (which a fast machine could outlast)."""
    import http.client
    from urllib.parse import urlparse

    verifier = serve_cluster.get_deployment_handle("Verifier", app_name="specdiff")
    assert _wait_no_sessions(verifier, 30)
    body = json.dumps(completion(LONG, max_tokens=1000, temperature=0.0, **FIXED))
    url = urlparse(BASE)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    conn.request("POST", url.path.rstrip("/") + "/v1/completions", body, {"content-type": "application/json"})
    deadline = time.monotonic() + 60  # on a loaded machine the decode may take a while to start
    while not verifier.sessions.remote().result(timeout_s=30) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(verifier.sessions.remote().result(timeout_s=30)) == 1  # the decode is running
    conn.close()  # the client goes away before any response (a 1000-token decode is far from done)
    assert _wait_no_sessions(verifier, 60)


def test_prometheus_metrics(app):
    # Ray exports Serve metrics on the node's metrics port (ray_ prefix); a report interval of 1 s is set in start_ray.
    post("/v1/completions", completion("metrics please", max_tokens=20, gamma=4))
    wanted = [
        "ray_specdiff_drafted_tokens_total",
        "ray_specdiff_accepted_tokens_total",
        "ray_specdiff_acceptance_length_bucket",
        "ray_specdiff_reached_at_position_total",
        "ray_specdiff_drafter_latency_s_bucket",
        "ray_specdiff_verifier_latency_s_bucket",
        "ray_specdiff_requests_total",
    ]
    deadline, text = time.monotonic() + 60, ""
    while time.monotonic() < deadline:
        text = requests.get(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=10).text
        if all(name in text for name in wanted):
            break
        time.sleep(1)
    missing = [name for name in wanted if name not in text]
    assert not missing, f"missing from /metrics: {missing}"
    assert 'position="1"' in text
