"""The request limits' pure parts (edgespec/server/limits.py, auth.py): the floor on a text's token
count never exceeds the real count, whatever the tokenizer family, and the Bearer scheme's case."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from edgespec.server.auth import credentials
from edgespec.server.guard import ConnectionGuard, OncePerKind
from edgespec.server.limits import TextBound, refuse_certain_overflow
from edgespec.server.protocol import ParsedRequest, RequestError

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

# Texts that stretch a floor: long runs a merge may swallow, accents NFC composes (e + U+0301),
# Hangul jamo NFKC joins three to one, ligatures it splits, special tokens' text, emoji.
HARD = [
    "the cat and the dog " * 40,
    " " * 300 + "\n" * 50,
    "e\u0301" * 200 + "\u1100\u1161\u11a8" * 100,
    "\ufb01\ufb02" * 100 + "<|im_start|>user<|im_end|>" * 20,
    "why is the river light? 🌊🌊🌊 " * 30,
    "decoding question " * 60,
]


def fast(tok) -> object:
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")


def trained(model, trainer, pre, normalizer=None):
    tok = tokenizers.Tokenizer(model)
    tok.pre_tokenizer, tok.normalizer = pre, normalizer
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    tok.train_from_iterator([t * 3 for t in HARD], trainer)
    return fast(tok)


def sentencepiece_like():
    """A Metaspace BPE behind an NFKC normalizer (which composes and splits characters)."""
    from tokenizers import models, normalizers, pre_tokenizers, trainers

    return trained(
        models.BPE(unk_token="<unk>"),
        trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>"], max_token_length=16),
        pre_tokenizers.Metaspace(),
        normalizers.NFKC(),
    )


@pytest.fixture(scope="module")
def byte_level(tiny_pair):
    return transformers.AutoTokenizer.from_pretrained(str(tiny_pair[0]))


def test_the_floor_never_exceeds_the_real_count(byte_level):
    for tok in (byte_level, sentencepiece_like()):
        bound = TextBound.of(tok)
        assert bound is not None
        for text in HARD:
            real = len(tok.encode(text, add_special_tokens=False))
            assert 1 <= bound.fewest_tokens(text) <= real, (text[:20], real)
            assert not bound.exceeds(text, real)  # never certain of more than there is
            assert bound.exceeds(text * 50, real)  # yet certain of a lot more


def test_no_floor_for_a_pre_tokenizer_that_drops_whitespace():
    from tokenizers import models, pre_tokenizers, trainers

    wordpiece = trained(
        models.WordPiece(unk_token="<unk>"),
        trainers.WordPieceTrainer(vocab_size=200, special_tokens=["<unk>"]),
        pre_tokenizers.Whitespace(),
    )
    assert TextBound.of(wordpiece) is None
    assert TextBound.of(object()) is None  # no vocabulary at all


def chat(text: str) -> ParsedRequest:
    return ParsedRequest("chat", "m", None, messages=({"role": "user", "content": text},))  # type: ignore[arg-type]


def test_a_prompt_certain_to_overflow_is_refused_without_tokenizing(byte_level):
    """The engine here cannot tokenize at all (no encode methods): only the length is read."""
    engine = SimpleNamespace(context_window=512, tokenizer=byte_level)
    bound = TextBound.of(byte_level)
    assert bound is not None
    with pytest.raises(RequestError) as info:
        refuse_certain_overflow(engine, chat("the cat " * 5000), bound, "messages")
    assert info.value.code == "context_length_exceeded" and "at least" in info.value.message
    raw = ParsedRequest("completion", "m", None, prompt="x" * 10**6)  # type: ignore[arg-type]
    with pytest.raises(RequestError, match="context window is 512"):
        refuse_certain_overflow(engine, raw, bound, "prompt")
    refuse_certain_overflow(engine, chat("the cat " * 100), bound, "messages")  # may fit: passes
    ids = ParsedRequest("completion", "m", None, prompt=(1,) * 4096)  # type: ignore[arg-type]
    refuse_certain_overflow(engine, ids, bound, "prompt")  # token ids: counted elsewhere


def test_the_bearer_scheme_is_case_insensitive():
    for header in (b"Bearer k1", b"bearer k1", b"BEARER  k1 ", b" bEaReR k1"):
        assert credentials(header) == b"k1"
    for header in (b"Basic k1", b"k1", b"", b"Bearerk1"):
        assert credentials(header) is None


class Conn:
    """A connection as the guard sees it: busy while a request is in flight; drop() closes it."""

    def __init__(self, busy: bool = False, waiting: bool = False):
        self.is_busy, self.is_waiting, self.dropped = busy or waiting, waiting, False

    def busy(self) -> bool:
        return self.is_busy

    def waiting(self) -> bool:
        return self.is_waiting

    def drop(self) -> None:
        self.dropped = True


def test_at_the_cap_the_longest_idle_connection_goes_and_only_a_busy_house_refuses():
    said: list[str] = []
    guard = ConnectionGuard(max_connections=3, timeout_s=5, say=said.append)
    a, b, c = Conn(), Conn(busy=True), Conn()
    assert all(guard.admit(conn) for conn in (a, b, c))
    guard.touch(a)  # a started a request: c is now the longest idle
    a.is_busy = False
    d = Conn()
    assert guard.admit(d) and c.dropped and not a.dropped and list(guard.open) == [b, a, d]
    e = Conn()
    assert guard.admit(e) and a.dropped  # then a: b is busy
    b.is_busy = d.is_busy = e.is_busy = True
    assert not guard.admit(Conn()) and not guard.admit(Conn())
    figures = {"open": 3, "timed_out": 0, "evicted": 2, "stalled": 0, "refused": 2}
    assert guard.figures() == figures
    assert len(said) == 2 and "closing the longest idle" in said[0] and "all with" in said[1]
    guard.forget(b)
    assert guard.admit(Conn()) and guard.figures()["open"] == 3


def test_at_the_cap_a_stalled_body_goes_before_a_newer_idle_connection():
    """Connections whose request head came and whose body does not are closed to make room,
    least recently active first (body bytes count as activity), before a client that
    connected after them; whole requests never are."""
    said: list[str] = []
    guard = ConnectionGuard(max_connections=3, timeout_s=5, say=said.append)
    a, b, c = Conn(waiting=True), Conn(busy=True), Conn(waiting=True)
    assert all(guard.admit(conn) for conn in (a, b, c))
    guard.touch(a)  # a sent some body: c has waited longest
    d = Conn()
    assert guard.admit(d) and c.dropped and not a.dropped and not b.dropped
    e = Conn()  # d, idle, connected after a's last bytes
    assert guard.admit(e) and a.dropped and not d.dropped and not b.dropped
    assert guard.figures()["stalled"] == 2 and guard.figures()["refused"] == 0
    assert len(said) == 1 and "waited longest for its request body" in said[0]


def test_repeated_log_lines_are_said_once_without_their_traceback():
    import logging

    once = OncePerKind()
    message = "socket.accept() out of system resource\nsocket: <fd=%d>"
    error = (OSError, OSError(24, "Too many open files"), None)
    records = [
        logging.LogRecord("asyncio", logging.ERROR, "", 0, message, (n,), error) for n in (3, 4, 5)
    ]
    passed = [r for r in records if once.filter(r)]
    assert len(passed) == 1 and passed[0].exc_info is None
    assert passed[0].getMessage() == "socket.accept() out of system resource (said once)"
