"""The project's own instruction set for distillation: templates x topics x styles, seeded.

Never drawn from a benchmark: every instruction is composed here from word lists, templates and
random numbers. Categories follow what chat users ask (writing, roleplay, reasoning, math, coding,
extraction, STEM, humanities, plus emails, poems, stories, advice, lists, rewriting, translation).

The stream is prefix-stable: `instructions(n, seed)[:m] == instructions(m, seed)` for m <= n, so an
instruction id (its index) means the same text whatever n a caller asked for. Data shards store ids.

    >>> xs = instructions(5, seed=0)
    >>> len(xs) == len(set(xs)) == 5
    True
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable, Iterator

from edgespec.distill import lexicon as W

Gen = Callable[[random.Random], str]

# "a" before a vowel sound -> "an" (templates say "a {form}"; "a university", "a one-day" stay).
_ARTICLE = re.compile(r"\b([Aa]) (?=[aeiouAEIOU](?!ni|se|ne|ro))")


def fix_articles(text: str) -> str:
    """Template glue: 'a opinion piece' -> 'an opinion piece'.

    >>> fix_articles("Write a essay, a haiku and a one-day plan for a university.")
    'Write an essay, a haiku and a one-day plan for a university.'
    """
    return _ARTICLE.sub(r"\1n ", text)


def _p(rng: random.Random, options: tuple[str, ...]) -> str:
    return rng.choice(options)


def _pair(rng: random.Random, options: tuple[tuple[str, str], ...]) -> tuple[str, str]:
    return rng.choice(options)


def _style(rng: random.Random, p: float = 0.5) -> str:
    """An optional trailing constraint (length, tone, format), with probability p."""
    return " " + _p(rng, W.STYLES) if rng.random() < p else ""


def _passage(rng: random.Random, sentences: int) -> str:
    """A short paragraph composed from sentence templates about one topic."""
    topic = _p(rng, W.TOPICS)
    out = []
    for _ in range(sentences):
        t = _p(rng, W.PASSAGE_SENTENCES)
        out.append(
            t.format(
                topic=topic,
                adj=_p(rng, W.ADJECTIVES),
                person=_p(rng, W.FIRST_NAMES),
                city=_p(rng, W.CITIES),
                n=rng.randint(2, 95),
                year=rng.randint(1950, 2023),
                group=_p(rng, W.GROUPS),
            )
        )
    return " ".join(out)


def writing(rng: random.Random) -> str:
    form, topic = _p(rng, W.WRITING_FORMS), _p(rng, W.TOPICS)
    t = _p(rng, W.WRITING_TEMPLATES)
    return t.format(form=form, topic=topic, audience=_p(rng, W.AUDIENCES)) + _style(rng)


def explanation(rng: random.Random) -> str:
    concept = _p(rng, W.STEM_CONCEPTS + W.HUMANITIES_CONCEPTS)
    t = _p(rng, W.EXPLAIN_TEMPLATES)
    return t.format(concept=concept, audience=_p(rng, W.AUDIENCES)) + _style(rng, 0.4)


def how_to(rng: random.Random) -> str:
    t = _p(rng, W.HOWTO_TEMPLATES)
    return t.format(task=_p(rng, W.TASKS)) + _style(rng, 0.4)


def comparison(rng: random.Random) -> str:
    a, b = rng.sample(W.COMPARE_PAIRS, 1)[0]
    t = _p(rng, W.COMPARE_TEMPLATES)
    return t.format(a=a, b=b, aspect=_p(rng, W.ASPECTS)) + _style(rng, 0.4)


def coding(rng: random.Random) -> str:
    lang = _p(rng, W.LANGUAGES)
    kind = rng.random()
    if kind < 0.55:
        t = _p(rng, W.CODE_WRITE_TEMPLATES)
        return t.format(lang=lang, task=_p(rng, W.CODE_TASKS)) + _style(rng, 0.2)
    if kind < 0.8:
        name, body = _pair(rng, W.PY_SNIPPETS)
        ask = _p(rng, W.CODE_READ_ASKS)
        return f"{ask}\n\n```python\n{body.format(name=name, n=rng.randint(2, 9))}\n```"
    return _p(rng, W.CODE_CONCEPT_TEMPLATES).format(lang=lang, concept=_p(rng, W.CODE_CONCEPTS))


def math_problem(rng: random.Random) -> str:
    t = _p(rng, W.MATH_TEMPLATES)
    nums = {f"n{i}": rng.randint(2, 60) for i in range(1, 5)}
    nums |= {"p": rng.choice((5, 10, 15, 20, 25, 30, 40, 50)), "price": rng.randint(3, 99)}
    s = t.format(
        name=_p(rng, W.FIRST_NAMES),
        name2=_p(rng, W.FIRST_NAMES),
        item=_p(rng, W.ITEMS),
        city=_p(rng, W.CITIES),
        **nums,
    )
    return s + _p(rng, ("", "", " Show your work.", " Explain each step.", " Answer briefly."))


def passage_task(rng: random.Random) -> str:
    text = _passage(rng, rng.randint(3, 6))
    t = _p(rng, W.PASSAGE_TASKS)
    return t.format(lang=_p(rng, W.HUMAN_LANGUAGES), tone=_p(rng, W.TONES), n=rng.randint(1, 3)) + (
        f"\n\n{text}"
    )


def listing(rng: random.Random) -> str:
    t = _p(rng, W.LIST_TEMPLATES)
    return t.format(n=rng.randint(3, 10), thing=_p(rng, W.LIST_THINGS), topic=_p(rng, W.TOPICS))


def advice(rng: random.Random) -> str:
    t = _p(rng, W.ADVICE_TEMPLATES)
    return t.format(situation=_p(rng, W.SITUATIONS)) + _style(rng, 0.3)


def roleplay(rng: random.Random) -> str:
    t = _p(rng, W.ROLEPLAY_TEMPLATES)
    return t.format(persona=_p(rng, W.PERSONAS), request=_p(rng, W.ROLEPLAY_REQUESTS))


def extraction(rng: random.Random) -> str:
    rows = []
    for _ in range(rng.randint(2, 4)):
        rows.append(
            f"{_p(rng, W.FIRST_NAMES)} {_p(rng, W.LAST_NAMES)} ordered {rng.randint(1, 9)} "
            f"{_p(rng, W.ITEMS)} for ${rng.randint(3, 400)} on {_p(rng, W.MONTHS)} "
            f"{rng.randint(1, 28)} and asked for delivery to {_p(rng, W.CITIES)}."
        )
    t = _p(rng, W.EXTRACT_TASKS)
    return f"{t}\n\n{' '.join(rows)}"


def reasoning(rng: random.Random) -> str:
    names = rng.sample(W.FIRST_NAMES, 4)
    t = _p(rng, W.REASONING_TEMPLATES)
    return t.format(
        a=names[0],
        b=names[1],
        c=names[2],
        d=names[3],
        n1=rng.randint(3, 40),
        n2=rng.randint(2, 12),
        item=_p(rng, W.ITEMS),
    )


def factual(rng: random.Random) -> str:
    country, capital = rng.sample(W.COUNTRIES, 1)[0]
    t = _p(rng, W.FACT_TEMPLATES)
    return t.format(
        country=country,
        capital=capital,
        concept=_p(rng, W.STEM_CONCEPTS + W.HUMANITIES_CONCEPTS),
        animal=_p(rng, W.ANIMALS),
        topic=_p(rng, W.TOPICS),
    )


def email(rng: random.Random) -> str:
    t = _p(rng, W.EMAIL_TEMPLATES)
    return t.format(
        recipient=_p(rng, W.RECIPIENTS), purpose=_p(rng, W.EMAIL_PURPOSES), tone=_p(rng, W.TONES)
    ) + _style(rng, 0.3)


def poem(rng: random.Random) -> str:
    t = _p(rng, W.POEM_TEMPLATES)
    return t.format(form=_p(rng, W.POEM_FORMS), topic=_p(rng, W.TOPICS + W.ANIMALS + W.CITIES))


def story(rng: random.Random) -> str:
    t = _p(rng, W.STORY_TEMPLATES)
    return t.format(
        character=_p(rng, W.CHARACTERS),
        event=_p(rng, W.STORY_EVENTS),
        setting=_p(rng, W.SETTINGS),
        genre=_p(rng, W.GENRES),
        n=rng.choice((50, 100, 150, 200, 300)),
    )


def classify(rng: random.Random) -> str:
    sentence = _p(rng, W.REVIEW_SENTENCES).format(
        item=_p(rng, W.ITEMS), adj=_p(rng, W.ADJECTIVES), city=_p(rng, W.CITIES)
    )
    return _p(rng, W.CLASSIFY_TASKS).format(text=sentence)


def brainstorm(rng: random.Random) -> str:
    t = _p(rng, W.BRAINSTORM_TEMPLATES)
    return t.format(n=rng.randint(3, 12), topic=_p(rng, W.TOPICS), group=_p(rng, W.GROUPS))


# (generator, weight): weights roughly follow what chat users ask most.
CATEGORIES: tuple[tuple[str, Gen, int], ...] = (
    ("writing", writing, 8),
    ("explanation", explanation, 10),
    ("how_to", how_to, 7),
    ("comparison", comparison, 5),
    ("coding", coding, 10),
    ("math", math_problem, 8),
    ("passage", passage_task, 7),
    ("list", listing, 5),
    ("advice", advice, 5),
    ("roleplay", roleplay, 5),
    ("extraction", extraction, 4),
    ("reasoning", reasoning, 6),
    ("factual", factual, 6),
    ("email", email, 4),
    ("poem", poem, 3),
    ("story", story, 4),
    ("classify", classify, 2),
    ("brainstorm", brainstorm, 3),
)


def iter_instructions(seed: int = 0) -> Iterator[str]:
    """Endless stream of distinct instructions; one seeded RNG, duplicates skipped."""
    rng = random.Random(seed)
    gens = [g for _, g, _ in CATEGORIES]
    weights = [w for _, _, w in CATEGORIES]
    seen: set[str] = set()
    misses = 0
    while misses < 10_000:
        text = fix_articles(rng.choices(gens, weights)[0](rng).strip())
        if text in seen:
            misses += 1
            continue
        misses = 0
        seen.add(text)
        yield text


def instructions(n: int, seed: int = 0) -> list[str]:
    """The first n distinct instructions of the seeded stream (fewer only if it runs dry)."""
    out: list[str] = []
    for text in iter_instructions(seed):
        if len(out) >= n:
            break
        out.append(text)
    return out


def is_eval(i: int, seed: int = 0, eval_fraction: float = 0.02) -> bool:
    """Whether instruction id i belongs to the held-out slice (a seeded hash of the id)."""
    h = hashlib.blake2b(f"{seed}:{i}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") / 2**64 < eval_fraction


def split(n: int, seed: int = 0, eval_fraction: float = 0.02) -> tuple[list[int], list[int]]:
    """(train ids, held-out ids) over instruction ids 0..n-1: disjoint, prefix-stable, seeded.

    >>> tr, ev = split(1000)
    >>> sorted(tr + ev) == list(range(1000)) and not set(tr) & set(ev)
    True
    """
    train: list[int] = []
    held: list[int] = []
    for i in range(n):
        (held if is_eval(i, seed, eval_fraction) else train).append(i)
    return train, held
