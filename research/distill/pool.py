"""The prompt pool: requests on real passages, numbered, split, decontaminated and saved.

Ids: prompt id = group * SLOTS + slot. Slot 0 is a request (requests.BUILDERS); slot 1, when
present, continues it: a `followup` (second user turn after the target's answer to slot 0) or a
`self_written` prompt (the target's answer to a `prompt_writing` request, used as a new request).
The held-out split is by group (`instructions.is_eval(group)`), so a conversation never straddles
it, and held-out groups quote only held-out passages.

The pool depends on the files of the machine that built it, so it is written once to a file
(gzip'd JSON lines, byte-for-byte deterministic) and a data job reads that file, never rebuilds.
Benchmark prompts (Spec-Bench, MT-bench) are read only to drop any passage that shares a run of
`SHINGLE` words with one of their turns; nothing from them enters the pool.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import random
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from edgespec.distill.instructions import is_eval
from edgespec.files import atomic_write_bytes
from research.distill.passages import Passage
from research.distill.requests import BUILDERS, KINDS, Request, followup_text, qa_closed

SLOTS = 4
POOL_VERSION = 1
SHINGLE = 10  # words


@dataclass(frozen=True)
class PoolPrompt:
    """One prompt of the pool. `user` is "" for self_written (made from the parent's answer, or
    `fallback` when that answer holds no usable request). `sources` lists (source, origin,
    licence) of every passage the prompt quotes or is about."""

    id: int
    kind: str
    user: str
    system: str = ""
    parent: int = -1
    fallback: str = ""
    sources: tuple[tuple[str, str, str], ...] = ()

    @property
    def group(self) -> int:
        return self.id // SLOTS


@dataclass
class Pool:
    seed: int
    eval_fraction: float
    prompts: list[PoolPrompt]
    info: dict = field(default_factory=dict)  # passages per source, decontamination counts

    def by_id(self) -> dict[int, PoolPrompt]:
        return {p.id: p for p in self.prompts}

    def is_held_out(self, prompt_id: int) -> bool:
        return is_eval(prompt_id // SLOTS, self.seed, self.eval_fraction)


# ----------------------------------------------------------------------------- decontamination


def shingles(text: str, n: int = SHINGLE) -> set[str]:
    """Every run of n consecutive lower-cased words.

    >>> sorted(shingles("A b c d", n=3))
    ['a b c', 'b c d']
    """
    words = re.findall(r"\w+", text.lower())
    return {" ".join(words[i : i + n]) for i in range(len(words) - n + 1)}


def benchmark_turns(prompts_dir: Path | None) -> list[str]:
    """Every turn of every *.jsonl question file in `prompts_dir` ([] if absent)."""
    if prompts_dir is None or not Path(prompts_dir).is_dir():
        return []
    turns = []
    for f in sorted(Path(prompts_dir).glob("*.jsonl")):
        for line in f.read_text(encoding="utf-8").split("\n"):  # a turn may hold a raw U+2028
            if line.strip():
                turns += [str(t) for t in json.loads(line).get("turns", [])]
    return turns


def decontaminate(passages: list[Passage], turns: list[str]) -> tuple[list[Passage], int]:
    """Drop passages sharing a SHINGLE-word run with any benchmark turn; (kept, dropped)."""
    bad: set[str] = set()
    for t in turns:
        bad |= shingles(t)
    kept = [p for p in passages if not (bad and shingles(p.text) & bad)]
    return kept, len(passages) - len(kept)


# ----------------------------------------------------------------------------- building


def _passage_held_out(p: Passage, seed: int, fraction: float) -> bool:
    """By origin (a file, or an object in it): all passages of one document fall on one side,
    so a function's docstring and its code, or two halves of a licence, never straddle the split."""
    h = hashlib.blake2b(f"{seed}:{p.origin}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") / 2**64 < fraction


class _Taker:
    """Hands out passages of the requested forms: a seeded shuffle per form, walked cyclically,
    so every passage is used before any is used twice."""

    def __init__(self, passages: list[Passage], seed: int) -> None:
        self.by_form: dict[str, list[Passage]] = {}
        for p in passages:
            self.by_form.setdefault(p.form, []).append(p)
        for form, xs in self.by_form.items():
            random.Random(f"{seed}:{form}").shuffle(xs)
        self.cursor = Counter[str]()
        self.rng = random.Random(seed)

    def __call__(self, *forms: str) -> Passage:
        have = [f for f in forms if self.by_form.get(f)] or sorted(self.by_form)
        form = self.rng.choice(have)
        xs = self.by_form[form]
        p = xs[self.cursor[form] % len(xs)]
        self.cursor[form] += 1
        return p


def _sources(req: Request) -> tuple[tuple[str, str, str], ...]:
    return tuple((p.source, p.origin, p.licence) for p in req.passages)


def build_pool(
    passages: list[Passage],
    n_groups: int,
    seed: int = 0,
    eval_fraction: float = 0.02,
    followup_rate: float = 0.2,
    benchmark: list[str] | None = None,
) -> Pool:
    """`n_groups` groups of prompts on `passages` (already collected), deterministic for a seed."""
    kept, dropped = decontaminate(passages, benchmark or [])
    split = [p for p in kept if not _passage_held_out(p, seed, eval_fraction)]
    held = [p for p in kept if _passage_held_out(p, seed, eval_fraction)]
    takers = {False: _Taker(split, seed), True: _Taker(held or split, seed + 1)}
    names = [k for k, _, _ in BUILDERS]
    weights = [w for _, _, w in BUILDERS]
    build = {k: b for k, b, _ in BUILDERS}
    prompts: list[PoolPrompt] = []
    for g in range(n_groups):
        rng = random.Random(f"{seed}:group:{g}")
        take = takers[is_eval(g, seed, eval_fraction)]
        kind = rng.choices(names, weights)[0]
        req = build[kind](rng, take)
        root = PoolPrompt(g * SLOTS, kind, req.user, req.system, sources=_sources(req))
        prompts.append(root)
        if kind == "prompt_writing":
            fb = qa_closed(rng, take)
            prompts.append(
                PoolPrompt(
                    root.id + 1,
                    "self_written",
                    "",
                    parent=root.id,
                    fallback=fb.user,
                    sources=root.sources + _sources(fb),
                )
            )
        elif rng.random() < followup_rate:
            text = followup_text(kind, rng)
            prompts.append(
                PoolPrompt(root.id + 1, "followup", text, parent=root.id, sources=root.sources)
            )
    info = {
        "passages": dict(sorted(Counter(p.source.split(":")[0] for p in kept).items())),
        "passages_by_form": dict(sorted(Counter(p.form for p in kept).items())),
        "held_out_passages": len(held),
        "dropped_by_decontamination": dropped,
        "benchmark_turns_checked": len(benchmark or []),
    }
    return Pool(seed, eval_fraction, prompts, info)


# ----------------------------------------------------------------------------- file


def write_pool(pool: Pool, path: Path) -> str:
    """Write the pool (gzip'd JSON lines: a header, then one prompt a line); returns its sha256.
    Same pool -> same bytes (gzip mtime 0), so the hash names the pool."""
    head = {
        "version": POOL_VERSION,
        "seed": pool.seed,
        "eval_fraction": pool.eval_fraction,
        "slots": SLOTS,
        "kinds": list(KINDS),
        "n_prompts": len(pool.prompts),
        **pool.info,
    }
    lines = [json.dumps(head, sort_keys=True)]
    lines += [json.dumps(asdict(p), ensure_ascii=False, sort_keys=True) for p in pool.prompts]
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz:
        gz.write(("\n".join(lines) + "\n").encode())
    data = buf.getvalue()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(Path(path), data)
    return hashlib.sha256(data).hexdigest()


def read_pool(path: Path) -> tuple[Pool, str]:
    """(pool, sha256 of the file)."""
    data = Path(path).read_bytes()
    # JSON lines end at "\n" only: a prompt's text may hold a raw U+2028 or U+0085.
    lines = [line for line in gzip.decompress(data).decode().split("\n") if line]
    head = json.loads(lines[0])
    prompts = []
    for line in lines[1:]:
        d = json.loads(line)
        d["sources"] = tuple(tuple(s) for s in d["sources"])
        prompts.append(PoolPrompt(**d))
    info = {k: v for k, v in head.items() if k not in ("version", "seed", "eval_fraction")}
    return Pool(head["seed"], head["eval_fraction"], prompts, info), hashlib.sha256(
        data
    ).hexdigest()


def kind_counts(prompts: Iterable[PoolPrompt]) -> dict[str, int]:
    c = Counter(p.kind for p in prompts)
    return {k: c[k] for k in KINDS if c[k]}
