"""Export of a feature drafter to vLLM's dflash layout: pure file checks (no vLLM needed; tests/test_vllm_engine.py
loads the export into vLLM)."""

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers import tiny_llama

from specdiff.vllm.export import DEFAULT_MIN_DRAFT_CONFIDENCE, EXPORT_META, MASK_EMBEDDING_FILE, export_vllm
from specdiff.models.feature_drafter import build_feature_drafter, save_feature_drafter

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny verifier saved as a Hugging Face folder (tied embeddings) and a 2-layer feature drafter for it with a
    draft vocabulary of 16 shuffled ids."""
    root = tmp_path_factory.mktemp("export")
    verifier = tiny_llama(64, seed=0, layers=4)
    verifier.save_pretrained(root / "verifier")
    drafter = build_feature_drafter(verifier, num_layers=2, seed=1, draft_vocab_size=16, max_gamma=6)
    ids = torch.randperm(64, generator=torch.Generator().manual_seed(0))[:16]
    drafter.set_draft_vocabulary(ids)
    with torch.no_grad():
        drafter.model.mask_embedding.normal_()
    save_feature_drafter(drafter, root / "drafter", verifier={"name": "tiny"})
    return verifier, drafter, root


def test_export_round_trip_keys_shapes_and_config(pair, tmp_path):
    verifier, drafter, root = pair
    export = export_vllm(root / "drafter", tmp_path / "out", verifier_dir=root / "verifier")
    c = drafter.config
    tensors = load_file(str(tmp_path / "out" / "model.safetensors"))
    ours = drafter.model.state_dict()
    # Every draft weight under vLLM's name, unchanged; our training-only tensors are not among them.
    for name, value in ours.items():
        if name in ("mask_embedding", "draft_ids"):
            assert name not in tensors
        else:
            assert torch.equal(tensors[name], value), name
    assert set(tensors) == (set(ours) - {"mask_embedding", "draft_ids"}) | {"lm_head.weight", "d2t"}
    assert not any(n.startswith("model.") or "embed_tokens" in n for n in tensors)
    # Draft vocabulary: vLLM maps draft index i to target id i + d2t[i], and scores it with lm_head row i.
    ids = drafter.model.draft_ids
    assert torch.equal(torch.arange(16) + tensors["d2t"], ids)
    assert torch.equal(tensors["lm_head.weight"], verifier.get_output_embeddings().weight.detach()[ids])
    mask = torch.load(tmp_path / "out" / MASK_EMBEDDING_FILE, weights_only=True)
    assert torch.equal(mask["embedding"], drafter.model.mask_embedding.detach())
    assert mask["mask_token_id"] == export.mask_token_id
    assert export.mask_token_id not in ids.tolist() and export.mask_token_id == max(set(range(64)) - set(ids.tolist()))

    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["model_type"] == "qwen3"
    assert cfg["dflash_config"] == {"mask_token_id": export.mask_token_id, "target_layer_ids": list(c.target_layer_ids),
                                    "specdiff_prompt_lookup": {"min_ngram": 2, "max_ngram": 4},  # the plugin's defaults
                                    "specdiff_min_draft_confidence": DEFAULT_MIN_DRAFT_CONFIDENCE}
    assert export.prompt_lookup == (2, 4) and export.min_draft_confidence == DEFAULT_MIN_DRAFT_CONFIDENCE
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
            cfg["head_dim"], cfg["intermediate_size"]) == (2, 32, 4, 2, 8, 64)
    assert (cfg["num_target_layers"], cfg["vocab_size"], cfg["draft_vocab_size"], cfg["block_size"]) == (4, 64, 16, 7)
    assert cfg["rope_parameters"]["rope_theta"] == c.rope_theta and cfg["rms_norm_eps"] == c.rms_norm_eps
    # transformers reads it as the Qwen3 config vLLM builds its draft layers from.
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(tmp_path / "out")
    assert type(hf).__name__ == "Qwen3Config" and hf.head_dim == 8 and hf.num_hidden_layers == 2
    assert (hf.rope_parameters or {}).get("rope_theta", getattr(hf, "rope_theta", None)) == c.rope_theta
    assert export.speculative_config(4) == {"method": "dflash", "model": str(tmp_path / "out"),
                                            "num_speculative_tokens": 4}
    with pytest.raises(ValueError, match=r"num_speculative_tokens must be an integer in \[1, 6\]"):
        export.speculative_config(7)
    meta = json.loads((tmp_path / "out" / EXPORT_META).read_text())
    assert meta["record"]["verifier"] == {"name": "tiny"} and meta["full_vocab"] is False


def test_full_vocab_export_leaves_the_head_to_the_verifier(pair, tmp_path):
    _, drafter, root = pair
    export = export_vllm(root / "drafter", tmp_path / "out", verifier_dir=root / "verifier", full_vocab=True,
                         mask_token_id=5)
    tensors = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert "lm_head.weight" not in tensors and "d2t" not in tensors
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert "draft_vocab_size" not in cfg and cfg["dflash_config"]["mask_token_id"] == 5
    assert export.draft_vocab_size is None and export.mask_token_id == 5


def test_prompt_lookup_is_written_for_the_plugin_or_left_out(pair, tmp_path):
    """dflash_config.specdiff_prompt_lookup switches specdiff.vllm.plugin on inside vLLM; None leaves vLLM's dflash
    as it is; the plugin reads back what the export wrote, and bad settings are named."""
    from specdiff.vllm.plugin import lookup_settings

    _, _, root = pair
    for lookup in ((1, 3), None):
        export = export_vllm(root / "drafter", tmp_path / str(lookup), verifier_dir=root / "verifier",
                             prompt_lookup=lookup)
        cfg = json.loads((export.path / "config.json").read_text())
        assert export.prompt_lookup == lookup
        assert lookup_settings(SimpleNamespace(**cfg)) == lookup
        assert ("specdiff_prompt_lookup" in cfg["dflash_config"]) == (lookup is not None)
    for bad in ((0, 2), (3, 2), (2,)):
        with pytest.raises(ValueError, match="prompt_lookup must be \\(min_ngram, max_ngram\\)"):
            export_vllm(root / "drafter", tmp_path / "bad", verifier_dir=root / "verifier", prompt_lookup=bad)
    with pytest.raises(ValueError, match="needs 1 <= min_ngram <= max_ngram"):
        lookup_settings(SimpleNamespace(dflash_config={"specdiff_prompt_lookup": {"min_ngram": 3, "max_ngram": 1}}))
    assert lookup_settings(SimpleNamespace()) is None


def test_confidence_cut_is_written_for_the_plugin_or_left_out(pair, tmp_path):
    from specdiff.vllm.plugin import confidence_setting

    _, _, root = pair
    for cut in (0.25, None):
        export = export_vllm(root / "drafter", tmp_path / str(cut), verifier_dir=root / "verifier",
                             min_draft_confidence=cut)
        cfg = json.loads((export.path / "config.json").read_text())
        assert export.min_draft_confidence == cut and confidence_setting(SimpleNamespace(**cfg)) == cut
        assert ("specdiff_min_draft_confidence" in cfg["dflash_config"]) == (cut is not None)
    for bad in (0, 1.0, -0.5, True, "0.3"):
        with pytest.raises(ValueError, match="min_draft_confidence must be a probability in \\(0, 1\\) or None"):
            export_vllm(root / "drafter", tmp_path / "bad", verifier_dir=root / "verifier", min_draft_confidence=bad)


def test_bad_inputs_are_named(pair, tmp_path):
    verifier, drafter, root = pair
    v = root / "verifier"
    with pytest.raises(ValueError, match="does not exist"):
        export_vllm(tmp_path / "nowhere", tmp_path / "o", verifier_dir=v)
    standalone = tmp_path / "standalone"
    standalone.mkdir()
    (standalone / "specdiff_drafter.json").write_text("{}")
    with pytest.raises(ValueError, match="is not a feature drafter"):
        export_vllm(standalone, tmp_path / "o", verifier_dir=v)
    broken = tmp_path / "broken"
    save_feature_drafter(drafter, broken)
    (broken / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="weights missing: .*model.safetensors"):
        export_vllm(broken, tmp_path / "o", verifier_dir=v)
    (broken / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(ValueError, match="corrupt drafter file"):
        export_vllm(broken, tmp_path / "o", verifier_dir=v)
    with pytest.raises(ValueError, match="must hold config.json"):
        export_vllm(root / "drafter", tmp_path / "o", verifier_dir=tmp_path)
    other = tmp_path / "other"
    tiny_llama(80, seed=0, layers=4).save_pretrained(other)
    with pytest.raises(ValueError, match="vocabulary of 64; verifier .* has 80"):
        export_vllm(root / "drafter", tmp_path / "o", verifier_dir=other)
    shallow = tmp_path / "shallow"
    tiny_llama(64, seed=0, layers=1).save_pretrained(shallow)
    with pytest.raises(ValueError, match="taps layers .* has only 1 layers"):
        export_vllm(root / "drafter", tmp_path / "o", verifier_dir=shallow)
    no_weights = tmp_path / "no_weights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text((v / "config.json").read_text())
    with pytest.raises(ValueError, match="holds no \\*.safetensors"):
        export_vllm(root / "drafter", tmp_path / "o", verifier_dir=no_weights)
    untied = tmp_path / "untied"
    untied.mkdir()
    cfg = json.loads((v / "config.json").read_text())
    (untied / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": False}))
    save_file({"model.embed_tokens.weight": torch.zeros(64, 32)}, str(untied / "model.safetensors"))
    with pytest.raises(ValueError, match="none of \\['lm_head.weight'\\]"):
        export_vllm(root / "drafter", tmp_path / "o", verifier_dir=untied)
    with pytest.raises(ValueError, match="mask_token_id must be a token id in \\[0, 64\\), got 64"):
        export_vllm(root / "drafter", tmp_path / "o", verifier_dir=v, mask_token_id=64)


def test_cli_writes_the_export_and_exits_2_on_bad_input(pair, tmp_path):
    _, _, root = pair
    cmd = [sys.executable, str(ROOT / "jobs" / "export_vllm.py")]
    ok = subprocess.run(cmd + [str(root / "drafter"), str(tmp_path / "out"), "--verifier", str(root / "verifier")],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "'method': 'dflash'" in ok.stdout and (tmp_path / "out" / "config.json").is_file()
    assert "prompt lookup n-grams 2-4" in ok.stdout
    off = subprocess.run(cmd + [str(root / "drafter"), str(tmp_path / "off"), "--verifier", str(root / "verifier"),
                                "--no-prompt-lookup"], capture_output=True, text=True, timeout=120)
    assert off.returncode == 0 and "no prompt lookup" in off.stdout, off.stderr
    bad = subprocess.run(cmd + [str(tmp_path / "nowhere"), str(tmp_path / "o2"), "--verifier", str(root / "verifier")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "error: drafter folder" in bad.stderr


def test_export_module_imports_no_vllm():
    code = "import sys, specdiff.vllm.export; assert 'vllm' not in sys.modules and 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_serve_app_exports_once_and_turns_speculation_off_above_its_batch(pair, tmp_path, monkeypatch):
    """serve_apps.specdiff_vllm's pieces that need no vLLM: the export is written once per drafter/verifier state and
    read back; speculation_max_batch becomes vLLM's dynamic schedule (γ up to that batch, 0 above); bad args name
    the field."""
    from specdiff.serving.vllm_app import VLLMAppConfig, _none_strings, export_for_vllm, speculative_config

    _, _, root = pair
    monkeypatch.setenv("SPECDIFF_HOME", str(tmp_path))
    first = export_for_vllm(root / "drafter", root / "verifier")
    again = export_for_vllm(root / "drafter", root / "verifier")
    assert first == again and first.path.parent == tmp_path / "vllm" and len(list(first.path.parent.iterdir())) == 1
    assert first.prompt_lookup == (2, 4)
    alone = export_for_vllm(root / "drafter", root / "verifier", prompt_lookup=False)  # its own export
    assert alone.prompt_lookup is None and alone.path != first.path
    assert "specdiff_prompt_lookup" not in json.loads((alone.path / "config.json").read_text())["dflash_config"]
    assert first.min_draft_confidence == DEFAULT_MIN_DRAFT_CONFIDENCE
    whole = export_for_vllm(root / "drafter", root / "verifier", min_draft_confidence=None)  # its own export too
    assert whole.min_draft_confidence is None and whole.path not in (first.path, alone.path)
    assert (first.path / "model.safetensors").is_file() and first.num_speculative_tokens == 6
    assert speculative_config(first, 4, None, 64) == {"method": "dflash", "model": str(first.path),
                                                      "num_speculative_tokens": 4}
    off = speculative_config(first, 4, 8, 64)
    assert off["num_speculative_tokens_per_batch_size"] == [[1, 8, 4], [9, 64, 0]]
    with pytest.raises(ValueError, match="num_speculative_tokens must be an integer in \\[1, 6\\]"):
        speculative_config(first, 7, None, 64)
    cfg = VLLMAppConfig.model_validate(_none_strings({"drafter": "none", "gamma": "2", "max_replicas": "3",
                                                      "min_draft_confidence": "none"}))
    assert cfg.drafter is None and cfg.gamma == 2 and cfg.max_replicas == 3 and cfg.min_draft_confidence is None
    assert VLLMAppConfig().min_draft_confidence == DEFAULT_MIN_DRAFT_CONFIDENCE
    with pytest.raises(ValueError, match="min_draft_confidence"):
        VLLMAppConfig(min_draft_confidence=1.5)
    with pytest.raises(ValueError, match="speculation_max_batch needs a drafter"):
        VLLMAppConfig(drafter=None, speculation_max_batch=4)
    with pytest.raises(ValueError, match="gamma"):
        VLLMAppConfig(gamma=0)


def test_cpu_engine_sizes_its_kv_cache_instead_of_asking_for_most_of_the_machine(tmp_path):
    """vLLM's CPU default wants 92% of the machine's memory free at start (it refused to start beside our own
    Decoder replica): a CPU deployment asks for kv_cache_gib (default 2 GiB); a GPU one leaves vLLM's default;
    engine_kwargs that size the cache win."""
    from specdiff.serving.vllm_app import VLLMAppConfig, engine_kwargs

    cpu = engine_kwargs(VLLMAppConfig(drafter=None, dtype="float32"), tmp_path)
    assert cpu["kv_cache_memory_bytes"] == 2 * 2**30 and cpu["dtype"] == "float32"
    assert engine_kwargs(VLLMAppConfig(drafter=None, kv_cache_gib=0.5), tmp_path)["kv_cache_memory_bytes"] == 2**29
    gpu = engine_kwargs(VLLMAppConfig(drafter=None, num_gpus=1, dtype="float32"), tmp_path)
    assert "kv_cache_memory_bytes" not in gpu
    own = engine_kwargs(VLLMAppConfig(drafter=None, engine_kwargs={"gpu_memory_utilization": 0.3}), tmp_path)
    assert "kv_cache_memory_bytes" not in own and own["gpu_memory_utilization"] == 0.3
    with pytest.raises(ValueError, match="kv_cache_gib"):
        VLLMAppConfig(kv_cache_gib=0)


def test_bench_vllm_crossover_is_where_speculation_stops_keeping_up():
    sys.path.insert(0, str(ROOT / "jobs"))
    from bench_vllm import crossover

    t = {1: {"vllm_plain": 20, "vllm_ours": 30, "vllm_ngram": 19}, 4: {"vllm_plain": 60, "vllm_ours": 61,
         "vllm_ngram": 70}, 16: {"vllm_plain": 130, "vllm_ours": 100, "vllm_ngram": 140}}
    assert crossover(t) == {"vllm_ours": 4, "vllm_ngram": None}  # slower at 1 already: none, even if faster later
    assert crossover({}) == {}


def test_serve_app_load_cap_auto_reads_this_machines_measurement(pair, tmp_path, monkeypatch):
    """load_cap=auto: the cap jobs/bench_vllm.py --find-cap kept for this machine, verifier, drafter, γ and dtype;
    without one, the fallback (speculation only for a request alone)."""
    from specdiff.serving.load_cap import FALLBACK_CAP, cap_path
    from specdiff.serving.vllm_app import VLLMAppConfig, resolve_load_cap

    _, _, root = pair
    monkeypatch.setenv("SPECDIFF_HOME", str(tmp_path))
    cfg = VLLMAppConfig(verifier=str(root / "verifier"), drafter=str(root / "drafter"), gamma=4, dtype="float32")
    cap, why = resolve_load_cap(cfg)
    assert cap == FALLBACK_CAP and "--find-cap" in why
    path = cap_path(tmp_path, root / "verifier", root / "drafter", 4, "float32")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"cap": 6}))
    assert resolve_load_cap(cfg) == (6, f"measured ({path})")
    assert resolve_load_cap(cfg.model_copy(update={"gamma": 3}))[0] == FALLBACK_CAP  # measured at γ=4 only
