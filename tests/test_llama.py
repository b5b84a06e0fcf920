"""The lean verifier backend (specdiff.models.llama + specdiff.models.tokenizer) computes what transformers computes: logits,
cached steps, tree passes, tapped states and greedy decodes on the same weights; its tokenizer matches
transformers' on the same folder; a folder it cannot compute exactly falls back (``auto``) or is refused
(``specdiff``); and loading + decoding with it never imports transformers (the point: a cold start ~6 s shorter)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import FixedDrafter, tiny_llama
from specdiff import HFVerifier, SamplingParams, SpecConfig, SpeculativeDecoder, generate_plain
from specdiff.models.llama import LlamaCausalLM, load_llama, unsupported_reason
from specdiff.models.sources import load_causal_lm
from specdiff.models.tokenizer import FastTokenizer, load_tokenizer
from specdiff.core.tree import build_tree

REPO = Path(__file__).resolve().parents[1]


def save_tiny(folder: Path, *, tie: bool = False, seed: int = 0) -> Path:
    from specdiff.serving.models import byte_tokenizer

    tokenizer = byte_tokenizer()
    model = tiny_llama(len(tokenizer), seed=seed, init_std=0.2, layers=3)
    if tie:
        model.config.tie_word_embeddings = True
        model.lm_head.weight = model.model.embed_tokens.weight
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def pair(request, tmp_path_factory):
    """(folder, transformers model, lean model) on the same weights."""
    from transformers import AutoModelForCausalLM

    folder = save_tiny(tmp_path_factory.mktemp("tiny"), tie=request.param)
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    lean = load_llama(folder)
    assert isinstance(lean, LlamaCausalLM)
    return folder, reference, lean


@torch.no_grad()
def test_logits_cached_steps_and_hidden_states_match_transformers(pair):
    from transformers import DynamicCache

    _, reference, lean = pair
    ids = torch.randint(0, 259, (2, 24), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(lean(ids).logits, reference(ids).logits, atol=1e-5, rtol=1e-5)
    ours, theirs = lean(ids, output_hidden_states=True), reference(ids, output_hidden_states=True)
    assert len(ours.hidden_states) == len(theirs.hidden_states) == 4
    for a, b in zip(ours.hidden_states, theirs.hidden_states):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    # Prefill, one step, then a chunk after cached positions (causal with an offset), each against transformers.
    cache, ref_cache = lean.new_cache(), DynamicCache()
    for lo, hi in ((0, 10), (10, 11), (11, 17)):
        a = lean(ids[:, lo:hi], past_key_values=cache, use_cache=True).logits
        b = reference(ids[:, lo:hi], past_key_values=ref_cache, use_cache=True).logits
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert cache.get_seq_length() == 17
    last = lean(ids[:, :5], logits_to_keep=2).logits
    assert last.shape == (2, 2, 259)


def test_tree_scores_commits_and_taps_match_transformers(pair):
    """The verifier's tree pass, a commit of a path off the first branch and the next pass: same log-probs and
    tapped states on both backends."""
    _, reference, lean = pair
    prompt = list(range(40, 60))
    sessions = [HFVerifier(m, tap_layers=[0, 2], tune_kernels=False).start(prompt) for m in (reference, lean)]
    torch.testing.assert_close(sessions[1].features, sessions[0].features, atol=1e-5, rtol=1e-5)
    tree = build_tree(prompt[-1], torch.tensor([[7, 8, 9], [7, 10, 11], [12, 13, 14]]))
    scores = [s.score(tree) for s in sessions]
    torch.testing.assert_close(scores[1], scores[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(sessions[1].tree_features, sessions[0].tree_features, atol=1e-5, rtol=1e-5)
    path = [1, 4]  # 7 then 10: the second candidate, whose nodes are moved next to the root
    assert [int(tree.tokens[i]) for i in path] == [7, 10]
    for s in sessions:
        s.commit(path, 5)
    assert sessions[0].tokens == sessions[1].tokens == prompt + [7, 10, 5]
    tree = build_tree(5, torch.tensor([[1, 2], [3, 4]]))
    torch.testing.assert_close(sessions[1].score(tree), sessions[0].score(tree), atol=1e-4, rtol=1e-4)


def test_greedy_decodes_agree_and_speculation_stays_exact(pair):
    _, reference, lean = pair
    prompt = [72, 101, 108, 108, 111]
    options = dict(max_new_tokens=24, sampling=SamplingParams(0.0))
    want = generate_plain(HFVerifier(reference, tune_kernels=False), prompt, **options).tokens
    plain = generate_plain(HFVerifier(lean, tune_kernels=False), prompt, **options).tokens
    assert plain == want
    drafter = FixedDrafter(torch.randn(4, 259, generator=torch.Generator().manual_seed(1)).softmax(-1))
    decoder = SpeculativeDecoder(drafter, HFVerifier(lean, tune_kernels=False))
    for gamma, k in ((1, 1), (4, 3)):
        out = decoder.generate(prompt, spec=SpecConfig(gamma=gamma, num_candidates=k), **options)
        assert out.tokens == want, (gamma, k)


def test_bfloat16_load(tmp_path):
    lean = load_llama(save_tiny(tmp_path), torch.bfloat16)
    assert {p.dtype for p in lean.parameters()} == {torch.bfloat16}
    with torch.no_grad():
        assert lean(torch.tensor([[1, 2, 3]])).logits.dtype == torch.bfloat16


@pytest.mark.parametrize("change, reason", [
    ({"model_type": "qwen2"}, "model_type 'qwen2'"),
    ({"attention_bias": True}, "attention_bias"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}}, "rope_type 'llama3'"),
])
def test_unsupported_configs_fall_back_or_are_refused(change, reason, tmp_path):
    folder = save_tiny(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    assert unsupported_reason(config) is None
    config.update(change)
    assert unsupported_reason(config).startswith(reason)
    if change.get("model_type") == "qwen2":  # loadable by transformers as well: check the fallback end to end
        (folder / "config.json").write_text(json.dumps(config))
        assert load_llama(folder) is None
        model, tokenizer = load_causal_lm(str(folder), "float32", backend="auto")
        assert type(model).__module__.startswith("transformers.")
        with pytest.raises(ValueError, match="backend 'specdiff' needs a local Llama-family folder"):
            load_causal_lm(str(folder), "float32", backend="specdiff")
    with pytest.raises(ValueError, match="backend must be one of auto, transformers, specdiff, got 'vllm'"):
        load_causal_lm(str(folder), backend="vllm")


def test_older_config_with_top_level_rope_theta(tmp_path):
    folder = save_tiny(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["rope_theta"] = config.pop("rope_parameters")["rope_theta"] = 5000.0
    (folder / "config.json").write_text(json.dumps(config))
    lean = load_llama(folder)
    assert lean.config.rope_theta == 5000.0
    torch.testing.assert_close(lean.model.inv_freq[1], torch.tensor(5000.0 ** (-2 / 8)))


def test_auto_backend_loads_the_lean_pair(tmp_path):
    folder = save_tiny(tmp_path)
    model, tokenizer = load_causal_lm(str(folder), "float32", backend="auto")
    assert isinstance(model, LlamaCausalLM) and isinstance(tokenizer, FastTokenizer)
    with pytest.raises(ValueError, match="additive 4D attention mask"):
        model(torch.tensor([[1, 2]]), attention_mask=torch.ones(1, 2))


def _compare_tokenizers(folder: Path) -> None:
    from transformers import AutoTokenizer

    ours, theirs = load_tokenizer(folder), AutoTokenizer.from_pretrained(folder)
    for name in ("eos_token_id", "bos_token_id", "pad_token_id"):
        assert getattr(ours, name) == getattr(theirs, name), name
    texts = ["Hello , world . It's   fine!", "def f(x):\n    return x ** 2\n", "  naïve café — 3.14 <|im_end|> x", ""]
    for text in texts:
        ids = theirs(text)["input_ids"]
        assert ours(text)["input_ids"] == ids and ours.encode(text) == ids
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)
    chats = [[{"role": "user", "content": "Write a prime check."}],
             [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
              {"role": "assistant", "content": "hello"}, {"role": "user", "content": "bye"}]]
    for messages in chats:
        for gen in (False, True):
            want = theirs.apply_chat_template(messages, add_generation_prompt=gen)
            want = want["input_ids"] if hasattr(want, "keys") else want
            assert ours.apply_chat_template(messages, add_generation_prompt=gen) == want
            assert ours.apply_chat_template(messages, add_generation_prompt=gen, tokenize=False) == \
                theirs.apply_chat_template(messages, add_generation_prompt=gen, tokenize=False)


def test_tokenizer_matches_transformers_on_the_byte_tokenizer(tmp_path):
    _compare_tokenizers(save_tiny(tmp_path))
    assert load_tokenizer(tmp_path / "missing") is None


def test_tokenizer_matches_transformers_on_the_default_verifier(specdiff_home):
    from specdiff.models.sources import default_verifier_path

    _compare_tokenizers(default_verifier_path())


def test_lean_load_and_decode_never_import_transformers(tmp_path):
    """A fresh interpreter: load with backend 'specdiff', render the chat template, decode greedily through the
    verifier -> transformers was never imported (its import is most of the cold start it replaces)."""
    folder = save_tiny(tmp_path)
    code = f"""
import sys
from specdiff import HFVerifier, generate_plain
from specdiff.models.sources import load_causal_lm
model, tok = load_causal_lm({str(folder)!r}, "float32", backend="specdiff")
prompt = tok.apply_chat_template([{{"role": "user", "content": "hi"}}], add_generation_prompt=True)
out = generate_plain(HFVerifier(model, tune_kernels=False), prompt, max_new_tokens=4)
assert len(out.tokens) == 4, out.tokens
print(sorted(m for m in sys.modules if m.split(".")[0] == "transformers"))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_serving_loads_the_lean_verifier_where_it_applies(tmp_path):
    """Serve replicas (verifier, feature drafter) load through ``ModelSource.backend``: lean by default for a
    Llama folder, transformers when asked; 'specdiff' with a device_map is a clear error."""
    from specdiff.serving.config import ModelSource
    from specdiff.serving.models import verifier_model

    folder = str(save_tiny(tmp_path))
    assert isinstance(verifier_model(ModelSource(verifier=folder)), LlamaCausalLM)
    assert type(verifier_model(ModelSource(verifier=folder, backend="transformers"))).__module__.startswith(
        "transformers.")
    with pytest.raises(ValueError, match="leave models.device_map unset"):
        verifier_model(ModelSource(verifier=folder, backend="specdiff", device_map="auto"))
