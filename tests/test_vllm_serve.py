"""``serve_apps.specdiff_vllm:app``: the embedded default verifier with a feature drafter inside vLLM, served by Ray
Serve LLM on this CPU. Greedy replies equal the verifier's greedy text, alone and with more requests at once than
``load_cap`` (the ingress then sends the rest to the plain engine, which the replies name), and vLLM's spec-decode
counters show the drafter accepted. Runs in the vLLM virtualenv (``-m vllm``)."""

import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import torch

if os.environ.get("SPECDIFF_REQUIRE_VLLM") == "1":
    import vllm  # noqa: F401
else:
    pytest.importorskip("vllm")

from serve_helpers import BASE, METRICS_PORT, run_app  # noqa: E402
from vllm_helpers import overfit_feature_drafter  # noqa: E402

from specdiff import HFVerifier, generate_plain  # noqa: E402
from specdiff.models.feature_drafter import save_feature_drafter  # noqa: E402
from specdiff.models.sources import default_verifier_path, load_causal_lm  # noqa: E402
from specdiff.prompts import chat_prompt_ids, load_prompts  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]
MODEL = "smollm2-135m-instruct"
TOKENS = 24


@pytest.fixture(scope="module")
def served(serve_cluster, tmp_path_factory):
    from specdiff.serving.vllm_app import build_vllm_app

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    model, tokenizer = load_causal_lm(str(default_verifier_path()), "float32")
    messages = [p for d in ("math", "code") for p in load_prompts(d, "eval", 3)]
    prompts = [chat_prompt_ids(tokenizer, m) for m in messages]
    verifier = HFVerifier(model)
    greedy = [generate_plain(verifier, p, max_new_tokens=TOKENS).tokens for p in prompts]
    threads = torch.get_num_threads()
    torch.set_num_threads(max(2, threads))
    try:  # a drafter that learnt these continuations (seconds): accepted tokens are then certain
        drafter = overfit_feature_drafter(model, [p + g for p, g in zip(prompts, greedy)], [len(p) for p in prompts],
                                          gamma=4, steps=120)
    finally:
        torch.set_num_threads(threads)
    folder = tmp_path_factory.mktemp("vllm-serve") / "drafter"
    save_feature_drafter(drafter, folder)
    app = build_vllm_app({"drafter": str(folder), "gamma": 4, "load_cap": 2, "max_num_seqs": 8,
                          "max_model_len": 1024, "dtype": "float32"})
    run_app(app, "vllm", "/vllm", timeout_s=900)
    texts = [tokenizer.decode(g, skip_special_tokens=True) for g in greedy]
    yield {"messages": messages, "texts": texts}
    serve_cluster.delete("vllm")


def _chat(message: str) -> dict:
    body = {"model": MODEL, "messages": [{"role": "user", "content": message}], "max_tokens": TOKENS,
            "temperature": 0}
    response = requests.post(BASE + "/vllm/v1/chat/completions", json=body, timeout=600)
    assert response.status_code == 200, response.text[:500]
    return response.json()


def _accepted() -> float:
    """vLLM's accepted draft tokens so far, summed over the label sets Ray's metrics endpoint shows."""
    text = requests.get(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("ray_vllm_spec_decode_num_accepted_tokens_total{"))


def test_one_request_equals_greedy_and_the_drafter_accepts(served):
    models = [m["id"] for m in requests.get(BASE + "/vllm/v1/models", timeout=60).json()["data"]]
    assert sorted(models) == [MODEL, MODEL + "-plain"]
    before = _accepted()
    out = _chat(served["messages"][0])
    assert out["choices"][0]["message"]["content"] == served["texts"][0]
    deadline = time.monotonic() + 60  # Ray exports the engine's counters every few seconds
    while _accepted() <= before and time.monotonic() < deadline:
        time.sleep(1)
    assert out["model"] == MODEL  # one request in flight: the speculative engine
    assert _accepted() > before  # speculation ran (1 request <= load_cap)


def test_more_requests_than_the_load_cap_take_the_plain_engine_and_stay_exact(served):
    with ThreadPoolExecutor(6) as pool:
        outs = list(pool.map(_chat, served["messages"]))
    assert [o["choices"][0]["message"]["content"] for o in outs] == served["texts"]
    engines = [o["model"] for o in outs]
    print("engines:", engines)
    assert MODEL + "-plain" in engines  # six at once, cap 2: at least one went to the plain engine
