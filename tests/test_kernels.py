import copy
import json

import pytest
import torch
import torch.nn.functional as F

from specdiff.models import kernels
from specdiff.models.kernels import ROWS, SmallRowsLinear, transposed_linear, tune_small_rows


def small_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8, bias=False))


@pytest.fixture(autouse=True)
def fresh_plans(monkeypatch):
    monkeypatch.setattr(kernels, "_PLANS", {})


def fake_timings(wins: set[int]):
    """measure_small_rows stand-in: the transposed form wins (half the time) exactly at ``wins``."""
    calls = []

    def measure(model, repeats=2):
        calls.append(model)
        return {r: (1.0, 0.5 if r in wins else 1.0) for r in ROWS}

    return measure, calls


@pytest.mark.parametrize("rows", [1, 2, 5, 12])
@pytest.mark.parametrize("bias", [True, False])
def test_transposed_linear_is_the_same_product(rows, bias):
    torch.manual_seed(rows)
    x, w = torch.randn(rows, 24), torch.randn(40, 24)
    b = torch.randn(40) if bias else None
    out = transposed_linear(x, w, b)
    assert out.shape == (rows, 40)
    torch.testing.assert_close(out, F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    # row-major, as F.linear's: a column-major result sent attention's heads (a view of it) to the slow math path
    assert out.is_contiguous()


def test_attention_after_a_planned_projection_takes_the_flash_kernel(monkeypatch):
    """A batch step's per-session query (one row of a 16-row projection, heads folded) keeps a unit head-dim
    stride, the layout CPU attention's flash kernel needs; the math path ran 5x slower per call."""
    layer = SmallRowsLinear(64, 9 * 64, bias=False)
    layer.small_rows = (16,)
    with torch.no_grad():
        q = layer(torch.randn(1, 16, 64)).view(1, 16, 9, 64).transpose(1, 2)
        one = q[:, :, 5:6].reshape(1, 3, 3, 64)  # what attend folds for a one-row piece (3 kv heads)
    assert one.stride(-1) == 1


def test_plan_switches_only_the_winning_row_counts(monkeypatch):
    measure, _ = fake_timings({2, 4})
    monkeypatch.setattr(kernels, "measure_small_rows", measure)
    model = small_model()
    reference = copy.deepcopy(model)
    assert tune_small_rows(model) == (2, 4)
    first = model[0]
    assert isinstance(first, SmallRowsLinear)
    used = []
    real = kernels.transposed_linear
    monkeypatch.setattr(kernels, "transposed_linear", lambda *a: used.append(a[0].shape[0]) or real(*a))
    with torch.no_grad():
        for rows in (1, 2, 3, 4, 7, 8, 13, 40):  # 3 follows 2, 7 follows 4; 8, 12 and 32 lost
            x = torch.randn(1, rows, 16)
            torch.testing.assert_close(model(x), reference(x), rtol=1e-5, atol=1e-5)
    assert sorted(set(used)) == [2, 3, 4, 7]
    # With gradients (training a copy of verifier layers), always F.linear: same values, gradients flow.
    used.clear()
    x = torch.randn(3, 16, requires_grad=True)
    model(x).sum().backward()
    assert used == [] and x.grad is not None


def test_batch_step_row_counts_are_planned_too(monkeypatch):
    """A replica's batch step multiplies many sessions' rows at once (16-96): those counts are timed and planned
    like a single decode's; above the last timed count, always F.linear."""
    measure, _ = fake_timings({16, 64})
    monkeypatch.setattr(kernels, "measure_small_rows", measure)
    model = small_model()
    assert tune_small_rows(model) == (16, 64)
    used = []
    real = kernels.transposed_linear
    monkeypatch.setattr(kernels, "transposed_linear", lambda *a: used.append(a[0].shape[0]) or real(*a))
    with torch.no_grad():
        for rows in (8, 16, 20, 24, 64, 95, 96, 97, 200):  # 20 follows 16, 95 follows 64; 24 and 96 lost
            model(torch.randn(1, rows, 16))
    assert sorted(set(used)) == [16, 20, 64, 95]


def test_no_winner_leaves_the_model_untouched(monkeypatch):
    measure, _ = fake_timings(set())
    monkeypatch.setattr(kernels, "measure_small_rows", measure)
    model = small_model()
    assert tune_small_rows(model) == ()
    assert type(model[0]) is torch.nn.Linear


def test_plan_is_kept_in_memory_and_on_disk(monkeypatch, tmp_path):
    measure, calls = fake_timings({2})
    monkeypatch.setattr(kernels, "measure_small_rows", measure)
    assert tune_small_rows(small_model(), tmp_path) == (2,)
    assert tune_small_rows(small_model(1), tmp_path) == (2,)  # same shapes, same process: no second measurement
    assert len(calls) == 1
    (saved,) = tmp_path.glob("small_rows-*.json")
    assert json.loads(saved.read_text())["small_rows"] == [2]
    monkeypatch.setattr(kernels, "_PLANS", {})  # a new process: read from disk
    assert tune_small_rows(small_model(2), tmp_path) == (2,)
    assert len(calls) == 1
    saved.write_text("not json")  # a damaged file is measured again, not trusted
    monkeypatch.setattr(kernels, "_PLANS", {})
    assert tune_small_rows(small_model(3), tmp_path) == (2,)
    assert len(calls) == 2


def test_other_shapes_get_their_own_plan(monkeypatch):
    measure, calls = fake_timings({4})
    monkeypatch.setattr(kernels, "measure_small_rows", measure)
    tune_small_rows(small_model())
    tune_small_rows(torch.nn.Sequential(torch.nn.Linear(16, 48)))
    assert len(calls) == 2


def test_a_copied_model_keeps_its_plan_on_its_own_weights(monkeypatch):
    measure, _ = fake_timings({2})
    monkeypatch.setattr(kernels, "measure_small_rows", measure)
    model = small_model()
    tune_small_rows(model)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin[2].weight.zero_()
        assert torch.count_nonzero(twin(torch.randn(2, 16))) == 0
        assert torch.count_nonzero(model(torch.randn(2, 16))) > 0


def test_real_measurement_on_a_small_model():
    timings = kernels.measure_small_rows(small_model(), repeats=1)
    assert set(timings) == set(ROWS)
    assert all(a > 0 and b > 0 for a, b in timings.values())
    plan = tune_small_rows(small_model())
    assert set(plan) <= set(ROWS)


def test_a_tuned_feature_drafter_proposes_the_same_marginals(monkeypatch, verifier_model):
    from specdiff import HFVerifier
    from specdiff.models.feature_drafter import build_feature_drafter

    measure, calls = fake_timings(set(ROWS))
    monkeypatch.setattr(kernels, "measure_small_rows", measure)
    tuned = build_feature_drafter(verifier_model, num_layers=1)
    reference = build_feature_drafter(verifier_model, num_layers=1)
    session = HFVerifier(verifier_model, tap_layers=tuned.tap_layers, tune_kernels=False).start([3, 17, 9, 41, 5])
    assert tuned.tune_kernels() == ROWS and calls
    assert isinstance(tuned.model.fc, SmallRowsLinear)
    used = []
    real = kernels.transposed_linear
    monkeypatch.setattr(kernels, "transposed_linear", lambda *a: used.append(a[0].shape[0]) or real(*a))
    for gamma in (1, 4, 8):
        got = tuned.propose(session.tokens, gamma, session.features)
        torch.testing.assert_close(got, reference.propose(session.tokens, gamma, session.features),
                                   rtol=1e-4, atol=1e-6)
    assert gamma in used  # the head's product over the mask rows took the transposed form
