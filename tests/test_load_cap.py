"""The vLLM app's load cap without vLLM: the gate's admission rule, the cap read from a machine measurement (or the
fallback), the crossover rule, and the app config's field."""

import json
import threading

import pytest

from specdiff.serving.load_cap import FALLBACK_CAP, LoadGate, cap_from_throughput, cap_path, read_cap


def test_gate_admits_up_to_the_cap_then_sends_the_rest_plain_until_it_drains():
    gate = LoadGate(2)
    assert [gate.enter() for _ in range(4)] == [True, True, False, False]
    gate.leave(True)
    gate.leave(True)  # two plain ones left in flight: load is under the cap, but the plain engine is busy
    assert gate.ongoing == 2 and not gate.enter()
    gate.leave(False)
    gate.leave(False)
    assert gate.ongoing == 1 and gate.plain == 1 and not gate.enter()
    gate.leave(False)
    gate.leave(False)
    assert gate.ongoing == 0 and gate.plain == 0 and gate.enter()  # drained: speculation again
    assert gate.counts == {"speculative": 3, "plain": 4}
    with pytest.raises(ValueError, match="load cap must be >= 1, got 0"):
        LoadGate(0)


def test_gate_counts_under_threads():
    gate = LoadGate(3)
    admitted = []

    def one():
        admitted.append(gate.enter())

    threads = [threading.Thread(target=one) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(admitted) == 3 and gate.ongoing == 50


def test_crossover_is_the_last_count_speculation_kept_up_at_least_one():
    t = {1: {"vllm_plain": 10, "vllm_ours": 14}, 2: {"vllm_plain": 18, "vllm_ours": 20},
         4: {"vllm_plain": 40, "vllm_ours": 30}, 8: {"vllm_plain": 60, "vllm_ours": 70}}
    assert cap_from_throughput(t, "vllm_ours") == 2  # 8 won again, but 4 lost first
    assert cap_from_throughput({1: {"vllm_plain": 10, "vllm_ours": 9}}, "vllm_ours") == 1  # alone: never below 1


def test_cap_read_from_the_machine_measurement_else_the_fallback(tmp_path):
    verifier, drafter = tmp_path / "v", tmp_path / "d"
    for folder, name in ((verifier, "config.json"), (drafter, "model.safetensors")):
        folder.mkdir()
        (folder / name).write_text("x")
    path = cap_path(tmp_path / "state", verifier, drafter, 4, "float32")
    cap, why = read_cap(path)
    assert cap == FALLBACK_CAP and "fallback" in why and "--find-cap" in why
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"cap": 4}))
    assert read_cap(path) == (4, f"measured ({path})")
    assert cap_path(tmp_path / "state", verifier, drafter, 4, "bfloat16") != path  # another dtype, another figure
    assert cap_path(tmp_path / "state", verifier, drafter, 2, "float32") != path
    path.write_text("{broken")
    assert read_cap(path)[0] == FALLBACK_CAP


def test_app_config_load_cap_field():
    from specdiff.serving.vllm_app import VLLMAppConfig, resolve_load_cap

    assert VLLMAppConfig().load_cap == "auto"
    assert resolve_load_cap(VLLMAppConfig(load_cap=3, drafter="x")) == (3, "load_cap")
    assert resolve_load_cap(VLLMAppConfig(load_cap=None))[0] is None
    assert resolve_load_cap(VLLMAppConfig(drafter=None))[0] is None
    with pytest.raises(ValueError, match="load_cap must be >= 1"):
        VLLMAppConfig(load_cap=0)
