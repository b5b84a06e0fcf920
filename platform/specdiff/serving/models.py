"""Model loading for the Serve deployments, from a ``ModelSource``.

``demo`` is a TINY RANDOM-INIT model pair (a 2-layer Llama verifier over a byte-level tokenizer and a
``build_small_drafter``): it exercises the whole serving path offline, on CPU, in seconds, and writes gibberish.
Point ``models.verifier`` / ``models.drafter`` at real weights for real text.
"""

from __future__ import annotations

import importlib
from functools import lru_cache

import torch

from ..drafter import Drafter, HFDiffusionDrafter, build_small_drafter
from ..drafter import load_drafter as load_saved_drafter
from ..dtypes import resolve_dtype
from ..models import resolve_model_path
from ..verifier import HFVerifier
from .config import DEMO, ModelSource

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (what the ByteLevel pre-tokenizer emits)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


@lru_cache(maxsize=1)
def byte_tokenizer():
    """A Hugging Face fast tokenizer with one token per byte (ids 0..255), three specials and a ChatML template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: b for b, c in _bytes_to_unicode().items()}
    vocab.update({tok: 256 + i for i, tok in enumerate(SPECIALS)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        bos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIALS[1:],
        chat_template=CHATML,
    )


def resolve_pair(source: ModelSource) -> tuple[ModelSource, str | None]:
    """With ``source.pair``: the source pointed at local folders of the registered pair it names now (downloaded
    once, verifier digest checked), and the drafter version's label (``specdiff-drafter-tiny/3``). Without: as is."""
    if source.pair is None:
        return source, None
    from ..registry import Registry

    override = None if source.verifier == DEMO else resolve_model_path(source.verifier)
    pair = Registry(source.tracking_uri).resolve_pair(source.pair, override)
    folders = {"verifier": str(pair.verifier_dir), "drafter": str(pair.drafter_dir), "pair": None,
               "tokenizer": source.tokenizer or str(pair.verifier_dir)}
    return source.model_copy(update=folders), f"{pair.drafter.name}/{pair.drafter.version}"


def pair_label(source: ModelSource) -> str:
    """Which drafter version ``source.pair`` names now (one registry read; nothing is downloaded)."""
    from ..registry import Registry

    version = Registry(source.tracking_uri).get(source.pair)
    return f"{version.name}/{version.version}"


def _dtype(source: ModelSource) -> torch.dtype:
    # Serving verifies trees of many rows per round: the "batched" rule of the platform's one policy.
    return resolve_dtype(source.dtype, phase="batched", device=_device())


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_tokenizer(source: ModelSource):
    if source.verifier == DEMO and source.tokenizer is None:
        return byte_tokenizer()
    from transformers import AutoTokenizer

    path = resolve_model_path(source.tokenizer or source.verifier)
    return AutoTokenizer.from_pretrained(path, trust_remote_code=source.trust_remote_code)


def demo_verifier_model(source: ModelSource, vocab_size: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=source.max_context or 1024,
        initializer_range=0.2,  # peaky, so greedy text is not decided by float noise
        attn_implementation="sdpa",
    )
    with torch.random.fork_rng():
        torch.manual_seed(source.demo_seed)
        return LlamaForCausalLM(config).eval()


def load_verifier(source: ModelSource) -> HFVerifier:
    if source.verifier == DEMO:
        model = demo_verifier_model(source, len(byte_tokenizer()))
    else:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(
            resolve_model_path(source.verifier),  # the embedded default name, a local folder or a hub id
            dtype=_dtype(source),
            device_map=source.device_map,
            trust_remote_code=source.trust_remote_code,
        )
        if source.device_map is None:
            model = model.to(_device())
    return HFVerifier(model, max_context=source.max_context)


def load_drafter(source: ModelSource) -> Drafter:
    if source.drafter.startswith("import:"):
        _, module, name = source.drafter.split(":")
        return getattr(importlib.import_module(module), name)(source)
    if source.drafter == DEMO:
        if source.verifier != DEMO:
            raise ValueError("drafter='demo' only pairs with verifier='demo'; give a drafter folder for a real verifier")
        return build_small_drafter(
            len(byte_tokenizer()), hidden_size=64, num_layers=1, num_heads=4, seed=source.demo_seed + 1
        )
    if source.drafter.startswith("hf:"):
        drafter = HFDiffusionDrafter.from_pretrained(
            source.drafter[3:], dtype=_dtype(source), trust_remote_code=source.trust_remote_code, **source.drafter_options
        )
    else:
        from ..feature_drafter import is_feature_drafter

        if is_feature_drafter(source.drafter):
            # Its context is the verifier's hidden states, which would have to travel verifier replica -> router ->
            # drafter replica every round; the split-pool app does not carry them yet.
            raise ValueError(f"models.drafter {source.drafter!r} is a feature drafter (conditioned on the verifier's "
                             "hidden states), which the Serve app cannot run yet; serve a standalone drafter (e.g. "
                             "$SPECDIFF_HOME/drafters/smollm2-standalone from jobs/build_drafter.py --ablations) or "
                             "decode in process (jobs/generate.py)")
        drafter = load_saved_drafter(source.drafter, dtype=_dtype(source))
    return HFDiffusionDrafter(drafter.model.to(_device()), drafter.config)  # re-wrapped: HFModel records the device


def stop_token_ids(tokenizer, chat: bool) -> list[int]:
    """Tokens that end a completion: the tokenizer's EOS, plus the end-of-turn token of a chat template."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    if chat:
        end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        if isinstance(end, int) and end != tokenizer.unk_token_id:
            ids.add(end)
    return sorted(ids)
