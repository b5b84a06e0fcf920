"""Shared pieces of the Serve tests: fake handles (plain-class tests) and an in-process Ray Serve cluster."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import torch

from specdiff import SamplingParams, SpecConfig, SpeculativeDecoder, generate_plain
from specdiff.serving.config import ModelSource
from specdiff.serving.models import byte_tokenizer, load_drafter, load_verifier

# Tiny models: one intra-op thread is faster and robust on a loaded machine (as tests/conftest.py does on main).
torch.set_num_threads(1)

HTTP_PORT = 8011
METRICS_PORT = 8276  # Prometheus endpoint of the test cluster's node
BASE = f"http://127.0.0.1:{HTTP_PORT}"
MODEL = "specdiff-demo"
DEMO = {"demo": True}  # the builder's `models` for the tiny random-init pair (the default is the embedded pair)


class _Response:
    def __init__(self, fn, args, delay_s=0.0, fail: Exception | None = None):
        self.fn, self.args, self.delay_s, self.fail = fn, args, delay_s, fail
        self.cancelled = False

    def result(self, timeout_s=None):
        if self.fail is not None:
            raise self.fail
        if timeout_s is not None and self.delay_s > timeout_s:
            time.sleep(timeout_s)
            raise TimeoutError("fake timeout")
        time.sleep(self.delay_s)
        return self.fn(*self.args)

    def cancel(self):
        self.cancelled = True


class FakeHandle:
    """Mimics a DeploymentHandle over a plain object: ``h.method.remote(*a).result(timeout_s=...)``.

    ``failures``: exceptions raised by the next calls (one each); ``delay_s``: latency of every call."""

    def __init__(self, target, *, delay_s: float = 0.0, failures: list[Exception] | None = None):
        self.target, self.delay_s = target, delay_s
        self.failures = list(failures or [])
        self.calls: list[str] = []
        self.session_ids: list[str] = []

    def options(self, session_id=None, **_):
        self.session_ids.append(session_id)
        return self

    def __getattr__(self, name):
        fn = getattr(self.target, name)
        handle = self

        class _Method:
            def remote(self, *args):
                handle.calls.append(name)
                fail = handle.failures.pop(0) if handle.failures else None
                return _Response(fn, args, handle.delay_s, fail)

        return _Method()


class SyncDrafter:
    """A drafter object with a synchronous ``propose`` for fake handles (the deployment's is async)."""

    def __init__(self, drafter):
        self.drafter = drafter
        self.vocab_size = drafter.vocab_size

    def propose(self, prefix, gamma):
        return self.drafter.propose_batch([prefix], gamma)[0]

    def draft(self, prefix, spec, seed):
        from specdiff.serving.servers import DrafterServer

        return DrafterServer(self.drafter).draft(prefix, spec, seed)


# -- local reference ---------------------------------------------------------------------------------------------


class LocalReference:
    """The engine run locally on the same demo models the deployments build."""

    def __init__(self, source: ModelSource | None = None):
        self.source = source or ModelSource(demo=True)
        self.tokenizer = byte_tokenizer()
        self.verifier = load_verifier(self.source)
        self.drafter = load_drafter(self.source)

    def decode(self, ids):
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def complete(self, prompt: str, *, max_tokens, temperature, seed, gamma=8, k=4, draft_temperature=1.5,
                 speculative=True, chat=False, stop_ids=None):
        if chat:
            ids = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
            )["input_ids"]
        else:
            ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        stop = stop_ids if stop_ids is not None else [self.tokenizer.eos_token_id]
        sampling = SamplingParams(temperature=temperature)
        if not speculative:
            result = generate_plain(self.verifier, ids, max_new_tokens=max_tokens, sampling=sampling,
                                    stop_token_ids=stop, seed=seed)
        else:
            spec = SpecConfig(gamma=gamma, num_candidates=k, draft_temperature=draft_temperature)
            result = SpeculativeDecoder(self.drafter, self.verifier).generate(
                ids, max_new_tokens=max_tokens, sampling=sampling, spec=spec, stop_token_ids=stop, seed=seed
            )
        return self.decode(result.tokens), result


# -- in-process Serve ----------------------------------------------------------------------------------------------

TESTS_DIR = Path(__file__).resolve().parent
ROOT = TESTS_DIR.parent


def start_ray(num_cpus: int = 8):
    """A private local Ray instance for the test session (never `ray stop`: other clusters share this machine)."""
    os.environ.update(
        RAY_USAGE_STATS_ENABLED="0",
        RAY_AUTH_MODE="disabled",
        RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S="60",
    )
    # Replica processes import the worktree's code and the tests' drafter factories.
    paths = [str(ROOT / "platform"), str(ROOT), str(TESTS_DIR)]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    import ray
    from ray import serve

    ray.init(
        address="local",  # a new private instance, never another engineer's running cluster
        num_cpus=num_cpus,
        include_dashboard=False,
        log_to_driver=False,
        _metrics_export_port=METRICS_PORT,
        _system_config={"metrics_report_interval_ms": 1000},
    )
    serve.start(http_options={"host": "127.0.0.1", "port": HTTP_PORT})
    return ray, serve


def run_app(app, name: str, route_prefix: str, timeout_s: float = 300):
    """serve.run with a deadline: an app asking for an undeclared resource would otherwise block forever."""
    from ray import serve

    error: list[BaseException] = []

    def target():
        try:
            serve.run(app, name=name, route_prefix=route_prefix, blocking=False)
        except BaseException as err:  # reported to the test
            error.append(err)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"app {name!r} not RUNNING after {timeout_s}s: {serve.status().applications.get(name)}")
    if error:
        raise error[0]


def slow_drafter(source: ModelSource):
    """Drafter factory for the timeout test: the demo drafter, 1.5 s per call."""

    class Slow:
        def __init__(self, inner):
            self.inner, self.vocab_size = inner, inner.vocab_size

        def propose(self, prefix, gamma):
            return self.propose_batch([prefix], gamma)[0]

        def propose_batch(self, prefixes, gamma):
            time.sleep(1.5)
            return self.inner.propose_batch(prefixes, gamma)

    return Slow(load_drafter(ModelSource(**{**source.model_dump(), "drafter": "demo"})))


def same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a, b)


# -- a feature drafter that drafts well for the demo verifier ------------------------------------------------------

FEATURE_PROMPTS = ["Hello", "The quick brown fox", "def f(x):", "Once upon a time, far away", "1 2 3 4"]


def fitted_feature_drafter(verifier_model, prompts=FEATURE_PROMPTS, *, gamma: int = 4, steps: int = 80,
                           taps=(0, 1), seed: int = 0):
    """A tiny feature drafter (built from the demo verifier's config, random init) fitted in a few seconds to the
    verifier's greedy continuations of ``prompts``, so that served rounds accept whole windows (tau ~ gamma + 1) and
    the committed-row plumbing is really exercised (a random drafter is rejected at position 1 every round)."""
    import torch.nn.functional as F

    from specdiff.models.feature_drafter import AnchorBatch, anchor_logits, build_feature_drafter
    from specdiff.models.verifier import HFVerifier

    tok = byte_tokenizer()
    drafter = build_feature_drafter(verifier_model, num_layers=1, target_layer_ids=list(taps), seed=seed,
                                    init_from_verifier=False)
    verifier = HFVerifier(verifier_model, tap_layers=drafter.tap_layers)
    seqs = []
    for p in prompts:
        ids = tok.encode(p, add_special_tokens=False)
        seqs.append((len(ids), ids + generate_plain(verifier, ids, max_new_tokens=48).tokens))
    b, length = len(seqs), max(len(s) for _, s in seqs)
    tokens = torch.zeros(b, length, dtype=torch.long)
    features = torch.zeros(b, length, drafter.config.feature_size)
    width = max(len(s) - n - gamma + 1 for n, s in seqs)
    anchors, valid = torch.zeros(b, width, dtype=torch.long), torch.zeros(b, width, dtype=torch.bool)
    for i, (n, s) in enumerate(seqs):
        tokens[i, : len(s)] = torch.tensor(s)
        features[i, : len(s)] = verifier.start(s + [0]).features  # rows of every token of s
        a = torch.arange(n - 1, len(s) - gamma)
        anchors[i, : len(a)], valid[i, : len(a)] = a, True
    idx = (anchors[..., None] + torch.arange(1, gamma + 1)).clamp_max(length - 1)
    labels = tokens.gather(1, idx.view(b, -1)).view(b, width, gamma)
    batch = AnchorBatch(anchors=anchors, labels=labels, valid=valid)
    params = [p for p in drafter.model.parameters() if p.requires_grad]
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        opt = torch.optim.Adam(params, lr=3e-3)
        drafter.model.train()
        for _ in range(steps):
            logits = anchor_logits(drafter, drafter.model, tokens, features, batch, gamma)
            loss = F.cross_entropy(logits[valid].reshape(-1, logits.shape[-1]), labels[valid].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
    drafter.model.eval()
    return drafter
