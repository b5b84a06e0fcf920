"""Offline replay of the adaptive policy over recorded rounds (``specdiff.core.replay``, ``jobs/policy_replay.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import FixedDrafter, OracleDrafter
from specdiff import HFVerifier, SpecConfig, SpeculativeDecoder, generate_plain
from specdiff.core.policy import SpeculationCosts, SpeculationPolicy
from specdiff.core.replay import RoundRecord, record, replay, speedup

ROOT = Path(__file__).resolve().parents[1]
COSTS = SpeculationCosts.affine(draft_s=0.010, base_s=0.049, per_node_s=0.001)
PROMPT = [3, 17, 9, 41, 5, 22]


def adaptive(costs):
    return SpeculationPolicy(costs, gammas=range(1, 5), ks=[1], allow_plain=True)


@pytest.fixture(scope="module")
def oracle_records(verifier_model):
    decoder = SpeculativeDecoder(OracleDrafter(verifier_model), HFVerifier(verifier_model))
    return record(decoder, PROMPT, max_new_tokens=24, gamma=4)


def test_a_fixed_window_replays_the_real_decode(verifier_model, oracle_records):
    # At T=0 a decode with a fixed window starts its rounds where the replay does and keeps what the records keep.
    decoder = SpeculativeDecoder(OracleDrafter(verifier_model), HFVerifier(verifier_model))
    real = decoder.generate(PROMPT, max_new_tokens=24, spec=SpecConfig(gamma=4, num_candidates=1))
    assert len(oracle_records) == 24 == len(real.tokens)
    assert all(r.candidates.shape[1] == 4 and set(r.streak_probs.flatten().tolist()) <= {0.0, 1.0}
               for r in oracle_records)
    replayed = replay(oracle_records, COSTS, gamma=4)
    assert replayed.tokens == 24 and replayed.rounds == real.stats.rounds and replayed.plain_steps == 0


def test_the_policy_speculates_over_a_good_drafter_and_not_over_a_useless_one(verifier_model, oracle_records):
    good, _ = speedup([oracle_records], COSTS, policy=adaptive)
    assert good > 2.0
    vocab = verifier_model.config.vocab_size
    greedy = generate_plain(HFVerifier(verifier_model), PROMPT, max_new_tokens=24).tokens
    wrong = next(t for t in range(vocab) if t not in greedy)  # a drafter that always proposes a token never emitted
    useless = FixedDrafter(torch.nn.functional.one_hot(torch.full((4,), wrong), vocab).float())
    records = record(SpeculativeDecoder(useless, HFVerifier(verifier_model)), PROMPT, max_new_tokens=24, gamma=4,
                     prompt_lookup=False)  # a tiny random model repeats itself: the copy would be good
    fixed, _ = speedup([records], COSTS, gamma=4)
    ratio, plain_share = speedup([records], COSTS, policy=adaptive)
    assert fixed < 0.9 and ratio > fixed and plain_share > 0.5


def test_replay_needs_a_policy_or_a_window(oracle_records):
    with pytest.raises(ValueError, match="either a policy or a fixed gamma"):
        replay(oracle_records, COSTS)


def test_the_replay_command_prints_fixed_windows_and_variants(oracle_records, tmp_path):
    path = tmp_path / "rounds.json"
    path.write_text(json.dumps({"gamma": 4, "dtype": "float32", "drafter": "oracle", "costs": COSTS.to_dict(),
                                "domains": {"code": [[r.to_dict() for r in oracle_records]]}}))
    assert RoundRecord.from_dict(oracle_records[0].to_dict()).candidates.tolist() == \
        oracle_records[0].candidates.tolist()
    cmd = [sys.executable, "jobs/policy_replay.py", "replay", str(path), "--variant", "light:prior_weight=1,probe_gamma=1"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "| fixed gamma=4 |" in out.stdout and "| adaptive (defaults) |" in out.stdout
    assert "adaptive light {'prior_weight': 1.0, 'probe_gamma': 1}" in out.stdout
    bad = subprocess.run(cmd[:-1] + ["light:prior=1"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "unknown policy keyword 'prior'" in bad.stderr
