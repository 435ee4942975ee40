"""The catalogue's Mac pairs (Qwen3, Llama 3.1/3.2, Qwen2.5, Gemma 3 and 4, Qwen3.5): what each
declares about its vocabularies, checked offline.

The real tokenizer files cannot be fetched here; EdgeSpec checks them when it loads a pair
(loading/checks.check_tokenizers: same ids for probe strings, same token at every shared id).
What this file checks instead:
1. every Mac pair declares one tokenizer family for both models and each model's embedding rows;
2. on tokenizer configs made here with the families' sizes and special tokens (byte-level BPE from
   the `tokenizers` library), the load-time check accepts two copies of one family and refuses
   tokenizers of two families, or one whose single token differs;
3. embedding widths that differ as the pairs' do (Qwen2.5 7B+ pads to 152,064 rows, its 0.5B draft
   to 151,936; Gemma 3 12B/27B 262,208 vs 1B 262,144) keep speculation exact: a tiny target and
   draft with such widths give plain decoding's greedy output and q = 0 past the draft's rows.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import mlx.core as mx
import pytest
from mlx_lm.tokenizer_utils import load as load_tokenizer
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from edgespec.config import MTP_DRAFT, SpecConfig
from edgespec.drafting.token import fit_vocab
from edgespec.errors import TokenizerMismatchError
from edgespec.loading.load import check_tokenizers, load_model
from edgespec.loading.specs import load_catalog
from edgespec.runtime import Engine
from tests.helpers.arch_models import generate
from tests.helpers.tiny import make_tokenizer
from tests.helpers.tiny_arch import build, family_config, save_quantized, seed_weights

MAC_PAIRS = {
    "qwen3-4b",
    "qwen3-8b",
    "qwen3-14b",
    "llama3.1-8b",
    "qwen2.5-7b",
    "gemma3-12b",
    "qwen3.5-9b",
    "gemma4-31b",
    "gemma4-31b-assistant",
}

# Family -> (tokenizer size, special tokens at their ids): what the made-up configs mimic.
FAMILIES = {
    "qwen3": (151669, {151643: "<|endoftext|>", 151644: "<|im_start|>", 151645: "<|im_end|>"}),
    "qwen2.5": (151665, {151643: "<|endoftext|>", 151644: "<|im_start|>", 151645: "<|im_end|>"}),
    "llama3": (
        128256,
        {128000: "<|begin_of_text|>", 128001: "<|end_of_text|>", 128009: "<|eot_id|>"},
    ),
    "gemma3": (
        262144,
        {0: "<pad>", 1: "<eos>", 2: "<bos>", 105: "<start_of_turn>", 106: "<end_of_turn>"},
    ),
    "qwen3.5": (248077, {248044: "<|endoftext|>", 248045: "<|im_start|>", 248046: "<|im_end|>"}),
    "gemma4": (262144, {0: "<pad>", 1: "<eos>", 2: "<bos>", 106: "<turn|>"}),
}


def test_every_mac_pair_declares_its_tokenizer_and_widths():
    cat = load_catalog()
    mac = {n: p for n, p in cat.pairs.items() if p.platform == "mac"}
    assert MAC_PAIRS <= set(mac)
    for name, pair in mac.items():
        v = pair.vocab
        assert v is not None, name
        assert v.tokenizer in FAMILIES, name
        size = FAMILIES[v.tokenizer][0]
        # Both embeddings cover the tokenizer (rows may be padded past it, never short of it).
        assert min(v.target_rows, v.draft_rows) >= size, name
        if pair.draft == MTP_DRAFT:  # the target's own MTP head, from the original checkpoint
            assert cat.model(pair.target).hf_repo, name
            continue
        assert pair.target.startswith("mlx-community/")
        if name.endswith("-assistant"):  # Google's own drafters, as published (bf16)
            assert pair.draft.startswith("google/gemma-4-") and pair.draft.endswith("-assistant")
            continue
        dflash = name.endswith(("-dflash", "-dflash2"))  # z-lab's DFlash and DFlash2 drafts
        assert pair.draft.startswith("z-lab/" if dflash else "mlx-community/")
    assert mac["gemma3-12b"].vocab.target_rows != mac["gemma3-12b"].vocab.draft_rows


class Made(dict):
    """(family, changed) -> a tokenizer config made on first use (see `made`)."""

    def __init__(self, root: Path):
        super().__init__()
        self.root = root

    def __missing__(self, key: tuple[str, int | None]) -> SimpleNamespace:
        self[key] = family_tokenizer(self.root, *key)
        return self[key]


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Made:
    return Made(tmp_path_factory.mktemp("tokenizers"))


def family_tokenizer(root: Path, family: str, changed: int | None = None) -> SimpleNamespace:
    """A tokenizer config with `family`'s size and special tokens at their ids: byte-level BPE
    over the 256 byte symbols, filler tokens up to the size. `changed`: one filler renamed."""
    size, specials = FAMILIES[family]
    alphabet = iter(sorted(pre_tokenizers.ByteLevel.alphabet()))
    vocab = {}
    for i in range(size):
        token = specials.get(i) or next(alphabet, None) or f"{family}#{i}"
        vocab[token + ("!" if i == changed else "")] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(specials.values()))
    out = root / f"{family}-{changed}"
    out.mkdir(parents=True)
    tok.save(str(out / "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": specials[max(specials)]}
    (out / "tokenizer_config.json").write_text(json.dumps(cfg))
    return SimpleNamespace(tokenizer=load_tokenizer(out), name=f"{family} tokenizer")


@pytest.mark.slow  # a family-sized tokenizer takes seconds to make and load
@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_load_check_accepts_one_family_and_refuses_another(made, family):
    size, specials = FAMILIES[family]
    target = made[family, None]
    vocab = target.tokenizer.get_vocab()
    assert len(vocab) == size and all(vocab[t] == i for i, t in specials.items())
    check_tokenizers(target, made[family, None])  # a pair of one family: every id compared
    names = list(FAMILIES)
    other = names[(names.index(family) + 1) % len(names)]
    with pytest.raises(TokenizerMismatchError):
        check_tokenizers(target, made[other, None])


@pytest.mark.slow
def test_the_load_check_finds_one_token_changed(made):
    size = FAMILIES["llama3"][0]
    with pytest.raises(TokenizerMismatchError, match=f"id {size - 7} is"):
        check_tokenizers(made["llama3", None], made["llama3", size - 7])


def _model(root: Path, vocab: int, layers: int, seed: int, tok: Path) -> Path:
    cfg = family_config("qwen3", vocab, layers)
    model = build(cfg)
    seed_weights(model, seed)
    return save_quantized(model, cfg, root, tok)


@pytest.mark.parametrize("target_rows,draft_rows", [(416, 384), (384, 416)])
def test_padded_embeddings_of_different_widths_speculate_exactly(tmp_path, target_rows, draft_rows):
    """Target and draft share a 384-token tokenizer; their embeddings are padded to other widths
    (like Qwen2.5 7B vs 0.5B, Gemma 3 12B vs 1B): the draft's logits are cut or -inf-padded to the
    target's width, so q = 0 past its rows and greedy output is plain decoding's."""
    tok = tmp_path / "tok"
    assert make_tokenizer(tok) == 384
    target = load_model(str(_model(tmp_path / "t", target_rows, 4, 0, tok)))
    draft = load_model(str(_model(tmp_path / "d", draft_rows, 2, 1, tok)))
    engine = Engine(target, draft)
    ids = engine.encode_raw("the cat and the dog in the house")
    plain, _ = generate(engine, ids, SpecConfig(method="none"), 30)
    spec, fin = generate(engine, ids, SpecConfig(k=3, method="draft", adaptive=False), 30)
    assert spec == plain and fin.stats.drafted > 0
    padded = fit_vocab(mx.zeros((2, draft_rows)), target_rows)
    assert padded.shape == (2, target_rows)
    if draft_rows < target_rows:
        assert mx.all(mx.isinf(padded[:, draft_rows:])).item()
