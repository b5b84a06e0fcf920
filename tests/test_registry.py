"""The drafter–verifier registry against a real MLflow (sqlite in tmp_path, no mocks): registration with lineage,
loading back by models:/<name>@<alias>, the τ guard on promotion, the exactly-once claim under a real race, and
clear errors for bad names, aliases and verifier digests."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing as mp

import pytest

from registry_helpers import make_assets, save_for, spec_for


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("builds")
    return make_assets(root / "v1", train_prompts=8), make_assets(root / "v2", sharpness=0.8, train_prompts=8)


@pytest.fixture
def reg(tmp_path, specdiff_home):
    from specdiff.lifecycle.evaluate import Registry

    return Registry(f"sqlite:///{tmp_path / 'mlflow.db'}")


def test_register_and_load_back_by_alias(reg, assets, tmp_path):
    import mlflow

    from specdiff import load_drafter
    from specdiff.registry import PRODUCTION

    v1 = reg.register_verifier("tiny", assets[0] / "verifier", source="make_tiny seed 0")
    assert v1.tags["specdiff.source"] == "make_tiny seed 0" and v1.tags["specdiff.digest"].startswith("sha256:")
    assert v1.tags["specdiff.tokenizer_digest"] == "none"  # the tiny verifier has no tokenizer files
    folder = save_for(reg.local_dir(v1), tmp_path / "good", good=True)
    d1 = reg.register_drafter("tiny", folder, v1, spec_for(assets[0]), data_digest="sha256:data")
    t = d1.tags
    assert (t["specdiff.models.verifier.model"], t["specdiff.models.verifier.version"]) == ("specdiff-verifier-tiny", "1")
    assert t["specdiff.models.verifier.digest"] == v1.tags["specdiff.digest"] and t["specdiff.teacher.data_digest"] == "sha256:data"
    alpha = json.loads(t["specdiff.eval.alpha"])
    assert len(alpha) == 8 and float(t["specdiff.eval.tau"]) == pytest.approx(1 + float(t["specdiff.eval.expected_streak"]))
    assert float(t["specdiff.eval.tau"]) > 1.3  # the first position copies the verifier's head
    run = reg.client.get_run(d1.run_id)  # the run page: metrics, α by position, the plot
    assert run.data.metrics["tau"] == pytest.approx(float(t["specdiff.eval.tau"]))
    history = reg.client.get_metric_history(d1.run_id, "alpha_by_position")
    assert [m.step for m in history] == list(range(1, 9)) and [m.value for m in history] == pytest.approx(alpha)
    assert [a.path for a in reg.client.list_artifacts(d1.run_id, "plots")] == ["plots/alpha_per_position.png"]

    assert reg.promote("tiny", d1, spec_for(assets[0]))[0]
    mlflow.set_tracking_uri(reg.uri)
    served = mlflow.pyfunc.load_model(f"models:/specdiff-drafter-tiny@{PRODUCTION}")
    local = load_drafter(folder)
    expected = local.propose([3, 1, 4], 4).argmax(-1).tolist()
    assert served.predict([{"prefix_ids": [3, 1, 4], "gamma": 4}]) == [expected]
    verifier = mlflow.pyfunc.load_model(f"models:/specdiff-verifier-tiny@{PRODUCTION}")
    assert len(verifier.predict([{"prompt_ids": [1, 2], "max_new_tokens": 3}])[0]) == 3

    pair = reg.resolve_pair("models:/specdiff-drafter-tiny@production")
    assert (str(pair.drafter.version), str(pair.verifier.version)) == ("1", "1")
    assert load_drafter(pair.drafter_dir).propose([3, 1, 4], 4).argmax(-1).tolist() == expected


def test_the_registry_records_figures_it_is_handed_and_measures_only_through_its_evaluator(assets, tmp_path,
                                                                                             specdiff_home):
    """The registry (an adapter) loads no model itself: without an evaluator it records the figures the lifecycle
    hands it, and asking it to measure names the registry that can."""
    from specdiff.lineage.evaluation import EvalResult
    from specdiff.registry import Registry

    plain = Registry(f"sqlite:///{tmp_path / 'plain.db'}")
    v1 = plain.register_verifier("tiny", assets[0] / "verifier")
    folder = save_for(plain.local_dir(v1), tmp_path / "d", good=True)
    spec = spec_for(assets[0])
    with pytest.raises(ValueError, match="specdiff.lifecycle.evaluate.Registry"):
        plain.register_drafter("tiny", folder, v1, spec)
    handed = EvalResult(expected_streak=1.5, alpha=[0.75, 0.5], windows=3)
    drafter = plain.register_drafter("tiny", folder, v1, spec, evaluation=handed)
    assert drafter.tags["specdiff.eval.tau"] == "2.500000"
    assert json.loads(drafter.tags["specdiff.eval.alpha"]) == [0.75, 0.5]
    assert plain.tau(drafter, spec) == 2.5  # measured on this spec: the recorded figure, nothing loaded
    assert plain.client.list_artifacts(drafter.run_id, "plots") == []  # no evaluator, nothing drew the plot
    with pytest.raises(ValueError, match="no evaluator"):
        plain.tau(drafter, dataclasses.replace(spec, seed=spec.seed + 1))


def test_promotion_is_guarded_by_tau_on_the_same_heldout_prompts(reg, assets, tmp_path):
    v1 = reg.register_verifier("tiny", assets[0] / "verifier")
    spec = spec_for(assets[0])
    verifier_dir = reg.local_dir(v1)
    weak = reg.register_drafter("tiny", save_for(verifier_dir, tmp_path / "w", good=False), v1, spec)
    assert reg.promote("tiny", weak, spec) == (True, f"promoted: tau {float(weak.tags['specdiff.eval.tau']):.4f}; "
                                                       "no production pair before")
    good = reg.register_drafter("tiny", save_for(verifier_dir, tmp_path / "g", good=True), v1, spec)
    ok, reason = reg.promote("tiny", good, spec)
    assert ok and reason.startswith("promoted: tau") and str(reg.production("tiny").version) == str(good.version)

    worse = reg.register_drafter("tiny", save_for(verifier_dir, tmp_path / "w2", good=False, seed=3), v1, spec)
    ok, reason = reg.promote("tiny", worse, spec)
    assert not ok and str(reg.production("tiny").version) == str(good.version)
    tag = reg.client.get_model_version("specdiff-drafter-tiny", str(worse.version)).tags["specdiff.promotion"]
    assert tag == reason and reason.startswith("not promoted: tau") and f"specdiff-drafter-tiny/{good.version}" in reason

    other = dataclasses.replace(spec, seed=1, offsets=(0, 4))  # another test: both sides re-measured, not read
    assert other.digest() != spec.digest()
    assert reg.tau(good, other) > reg.tau(worse, other)
    assert reg.promote("tiny", worse, spec, force=True)[0] and str(reg.production("tiny").version) == str(worse.version)


def _race(uri: str, home: str, barrier, results, i: int) -> None:
    import os

    os.environ["SPECDIFF_HOME"] = home
    from specdiff.registry import Registry

    registry = Registry(uri)
    barrier.wait()  # every process calls claim() at the same moment
    results[i] = registry.claim("tiny", "7", f"racer-{i}")


def test_claim_is_won_by_exactly_one_of_many_racing_processes(reg, specdiff_home):
    from specdiff.registry import claim_name

    reg.client.search_experiments()  # the store's tables exist before the race (first use creates them)
    ctx = mp.get_context("spawn")
    n = 3
    barrier, results = ctx.Barrier(n, timeout=120), ctx.Manager().dict()
    procs = [ctx.Process(target=_race, args=(reg.uri, str(specdiff_home), barrier, results, i)) for i in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(180)
    for p in procs:
        if p.is_alive():  # never leave a stuck child behind
            p.kill()
    assert all(p.exitcode == 0 for p in procs)
    winners = [i for i, r in results.items() if r is not None]
    assert len(results) == n and len(winners) == 1
    state = reg.claim_state("tiny", "7")
    assert state["specdiff.claim.owner"] == f"racer-{winners[0]}" and state["specdiff.lifecycle.realign.status"] == "claimed"
    assert reg.client.get_experiment_by_name(claim_name("tiny", "7")).experiment_id == results[winners[0]]
    assert reg.claim("tiny", "7", "late") is None


def test_bad_inputs_name_the_missing_thing(reg, assets, tmp_path):
    v1 = reg.register_verifier("tiny", assets[0] / "verifier")
    v2 = reg.register_verifier("tiny", assets[1] / "verifier")
    folder = save_for(reg.local_dir(v1), tmp_path / "d", good=False)
    with pytest.raises(ValueError, match=r"registered model 'specdiff-drafter-nope' does not exist .*"
                                         r"registered: \['specdiff-verifier-tiny'\]"):
        reg.resolve_pair("models:/specdiff-drafter-nope@production")
    with pytest.raises(ValueError, match="distilled against verifier digest sha256:.* not specdiff-verifier-tiny/2"):
        reg.register_drafter("tiny", folder, v2, spec_for(assets[0]))  # aligned to v1, not v2
    drafter = reg.register_drafter("tiny", folder, v1, spec_for(assets[0]))
    with pytest.raises(ValueError, match=r"'specdiff-drafter-tiny' has no alias 'production' \(aliases: \[\]\)"):
        reg.resolve_pair("models:/specdiff-drafter-tiny@production")
    with pytest.raises(ValueError, match=r"has no version '5' \(versions: \[1\]\)"):
        reg.get("models:/specdiff-drafter-tiny/5")
    with pytest.raises(ValueError, match="model URI must look like models:/"):
        reg.get("specdiff-drafter-tiny")
    # Load time: the verifier handed to the pair is another build than the one the drafter was distilled against.
    with pytest.raises(ValueError, match=r"verifier digest mismatch: drafter specdiff-drafter-tiny/1 is aligned to "
                                         r"specdiff-verifier-tiny/1 with digest sha256:\w+, but the verifier at .* "
                                         r"has digest sha256:\w+"):
        reg.resolve_pair(f"models:/specdiff-drafter-tiny/{drafter.version}", verifier_dir=reg.local_dir(v2))
    reg.client.set_model_version_tag(drafter.name, str(drafter.version), "specdiff.models.verifier.digest", "sha256:0")
    with pytest.raises(ValueError, match="verifier digest mismatch.*with digest sha256:0, but"):
        reg.resolve_pair(f"models:/specdiff-drafter-tiny/{drafter.version}")
