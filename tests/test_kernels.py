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


def fake_timings(wins: set[int], packed: set[int] = frozenset()):
    """measure_small_rows stand-in: the transposed form wins (half the time) exactly at ``wins``, the packed one
    (a third of the time) at ``packed``."""
    calls = []

    def measure(model, repeats=2):
        calls.append(model)
        return {r: (1.0, 0.5 if r in wins else 1.0, 0.3 if r in packed else 1.0) for r in ROWS}

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
    """A replica's batch step multiplies many sessions' rows at once (16-256): those counts are timed and planned
    like a single decode's; above the last timed count, never the transposed form."""
    measure, _ = fake_timings({16, 64})
    monkeypatch.setattr(kernels, "measure_small_rows", measure)
    model = small_model()
    assert tune_small_rows(model) == (16, 64)
    used = []
    real = kernels.transposed_linear
    monkeypatch.setattr(kernels, "transposed_linear", lambda *a: used.append(a[0].shape[0]) or real(*a))
    with torch.no_grad():
        for rows in (8, 16, 20, 24, 64, 95, 96, 97, 200, 256, 300):  # 20 follows 16, 95 follows 64; 24, 96 lost
            model(torch.randn(1, rows, 16))
    assert sorted(set(used)) == [16, 20, 64, 95]


@pytest.mark.parametrize("last_packed", [True, False])
def test_prefill_rows_take_the_packed_form_where_it_won_at_the_last_count(monkeypatch, last_packed):
    """Above the last timed count (a prefill), the packed form if it took that count, else F.linear."""
    top = ROWS[-1]
    measure, _ = fake_timings(set(), packed={16, top} if last_packed else {16})
    monkeypatch.setattr(kernels, "measure_small_rows", measure)
    model = small_model()
    tune_small_rows(model)
    used = []
    real = kernels.packed_linear
    monkeypatch.setattr(kernels, "packed_linear", lambda x, *a: used.append(x.numel() // x.shape[-1]) or real(x, *a))
    with torch.no_grad():
        for rows in (16, top - 1, top, top + 1, 4 * top):
            model(torch.randn(1, rows, 16))
    assert sorted(set(used)) == ([16, top, top + 1, 4 * top] if last_packed else [16])


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
    assert all(len(t) == 3 and all(s > 0 for s in t) for t in timings.values())
    model = small_model()
    plan = tune_small_rows(model)
    assert set(plan) <= set(ROWS) and set(kernels.packed_rows(model)) <= set(ROWS) - set(plan)


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


@pytest.mark.parametrize("rows", [1, 3, 16, 40])
@pytest.mark.parametrize("bias", [True, False])
def test_packed_linear_is_the_same_product(rows, bias):
    torch.manual_seed(rows)
    x, w = torch.randn(1, rows, 24), torch.randn(40, 24)
    b = torch.randn(40) if bias else None
    out = kernels.packed_linear(x, kernels.pack_weight(w), b)
    assert out.shape == (1, rows, 40) and out.is_contiguous()
    torch.testing.assert_close(out, F.linear(x, w, b), rtol=1e-5, atol=1e-5)


def test_choose_forms_takes_the_fastest_form_that_beats_f_linear():
    t = {1: (1.0, 0.5, 0.6), 2: (1.0, 0.6, 0.5), 4: (1.0, 0.95, 0.92), 8: (1.0, 0.5, float("inf")), 16: (1.0, 0.4)}
    assert kernels.choose_forms(t) == ([1, 8, 16], [2])  # 4: neither within WIN of F.linear


def test_packed_row_counts_follow_the_plan_and_the_weight(monkeypatch):
    """Counts planned for the packed form run oneDNN's product on a packed copy, made once and again when the weight
    changes in place; with gradients, F.linear; a deep copy packs its own weights."""
    measure, _ = fake_timings({2}, packed={16, 64})
    monkeypatch.setattr(kernels, "measure_small_rows", measure)
    model = small_model()
    reference = copy.deepcopy(model)
    assert tune_small_rows(model) == (2,) and kernels.packed_rows(model) == (16, 64)
    packs, used = [], []
    real_pack, real_run = kernels.pack_weight, kernels.packed_linear
    monkeypatch.setattr(kernels, "pack_weight", lambda w: packs.append(tuple(w.shape)) or real_pack(w))
    monkeypatch.setattr(kernels, "packed_linear", lambda x, *a: used.append(x.numel() // x.shape[-1])
                        or real_run(x, *a))
    with torch.no_grad():
        for rows in (2, 8, 16, 20, 64, 96, 200):  # 20 follows 16; 96 and 200 are not packed counts
            x = torch.randn(1, rows, 16)
            torch.testing.assert_close(model(x), reference(x), rtol=1e-5, atol=1e-5)
        assert sorted(set(used)) == [16, 20, 64] and packs == [(32, 16), (8, 32)]  # each weight packed once
        for net in (model, reference):
            net[2].weight.mul_(2.0)  # an in-place update (an optimizer step): the packed copy is made again
        x = torch.randn(1, 16, 16)
        torch.testing.assert_close(model(x), reference(x), rtol=1e-5, atol=1e-5)
        assert packs[2:] == [(8, 32)]
        twin = copy.deepcopy(model)
        twin[2].weight.zero_()
        assert torch.count_nonzero(twin(x)) == 0 and torch.count_nonzero(model(x)) > 0
    used.clear()
    x = torch.randn(16, 16, requires_grad=True)
    model(x).sum().backward()
    assert used == [] and x.grad is not None


def test_packed_form_is_not_timed_where_its_copies_would_not_fit(monkeypatch):
    monkeypatch.setattr(kernels, "_available_memory", lambda: 1000)  # bytes: less than 4x the weights
    timings = kernels.measure_small_rows(small_model(), repeats=1)
    assert all(t[2] == float("inf") and t[0] > 0 for t in timings.values())
