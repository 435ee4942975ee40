"""Requests of every kind users make, built on real passages (sources.py) with the wordings of
phrasings.py. Each builder takes a seeded `random.Random` and `take(*forms)`, which hands out the
next passage of one of the given forms, and returns a `Request`.

Kinds (their order is the code stored with each answer; append, never reorder):
  summarize, qa_context (answer from a text or from several documents), qa_closed (short factual
  questions), extract, rewrite, translate, code_explain, code_write, math, chat (open chat and
  writing), roleplay, followup (a second user turn after the target's first answer),
  prompt_writing (the target is asked to write a request) and self_written (that request, as the
  user's prompt).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass

from edgespec.distill import instructions as I
from edgespec.distill import lexicon as W
from research.distill import phrasings as P
from research.distill.passages import LONG_CHARS, Passage, sentences

KINDS = tuple(
    "summarize qa_context qa_closed extract rewrite translate code_explain code_write math chat "
    "roleplay followup prompt_writing self_written".split()
)
PROSE_FORMS = ("prose", "docstring", "reference", "legal", "changelog")
Take = Callable[..., Passage]


@dataclass(frozen=True)
class Request:
    """One user request: `user` is the message, `system` an optional system message, `passages`
    the real texts it quotes or is about (their origins and licences go into the data card)."""

    kind: str
    user: str
    passages: tuple[Passage, ...] = ()
    system: str = ""


def _pick(rng: random.Random, xs: tuple[str, ...]) -> str:
    return rng.choice(xs)


def _fill(template: str, **fields: object) -> str:
    """str.format that leaves unknown {fields} alone (passages may contain braces; they are
    inserted last, through {p} / {q} / {docs}, and never re-formatted)."""
    return re.sub(r"\{(\w+)\}", lambda m: str(fields.get(m.group(1), m.group(0))), template)


def name_of(p: Passage) -> str:
    """Short name of what a passage is about: `json.dumps(obj)` -> `json.dumps`."""
    return p.title.split("(")[0] or p.source


def keyword(text: str, rng: random.Random) -> str:
    """A salient term of a text: an identifier-like or capitalised word that is not the first of
    its sentence, else a long repeated word, else "this topic".

    >>> keyword("Use the --force flag. It calls shutil.rmtree on Linux.", random.Random(0)) in (
    ...     "--force", "shutil.rmtree", "Linux")
    True
    """
    words = re.findall(
        r"(?<![\w.])(--?[a-z][\w-]+|[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)+|\w+_\w+)", text
    )
    caps = re.findall(r"(?<=[a-z,;] )([A-Z][a-zA-Z]{3,})", text)
    pool = sorted(set(words + caps))
    if not pool:
        long = [w for w in re.findall(r"[a-z]{7,}", text.lower()) if text.lower().count(w) > 1]
        pool = sorted(set(long))
    return rng.choice(pool) if pool else "this topic"


def question_for(p: Passage, rng: random.Random) -> str:
    """A question about one passage, worded for its form."""
    kw = keyword(p.text, rng)
    opts = re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", p.text)
    ver = re.search(r"\(([^)]+)\)", p.text)
    bank = {
        "docstring": P.Q_DOCSTRING,
        "code": P.Q_CODE,
        "reference": P.Q_REFERENCE if opts else P.Q_REFERENCE[1:],
        "legal": P.Q_LEGAL,
        "changelog": P.Q_CHANGELOG,
        "record": P.Q_RECORD,
    }.get(p.form, P.Q_PROSE)
    return _fill(
        _pick(rng, bank),
        name=name_of(p),
        title=p.title or p.source,
        kw=kw,
        opt=rng.choice(opts) if opts else kw,
        ver=ver.group(1) if ver else "this version",
    )


def _up_to(limit: int, docs: list[Passage]) -> list[Passage]:
    """The leading documents whose texts fit in `limit` characters together (at least one)."""
    out: list[Passage] = []
    size = 0
    for d in docs:
        size += len(d.text)
        if out and size > limit:
            break
        out.append(d)
    return out


def _lc(q: str) -> str:
    return q[0].lower() + q[1:] if q else q


def _common(rng: random.Random, p: Passage) -> dict[str, object]:
    return {
        "title": p.title or p.source,
        "audience": _pick(rng, P.AUDIENCES),
        "tone": _pick(rng, P.TONES),
        "recipient": _pick(rng, P.RECIPIENTS),
        "lang": _pick(rng, P.LANGS),
        "n": rng.randint(2, 5),
        "w": rng.choice((50, 80, 120)),
    }


# ----------------------------------------------------------------------------- builders


def summarize(rng: random.Random, take: Take) -> Request:
    p = take(*PROSE_FORMS, "record")
    q = take(*PROSE_FORMS) if rng.random() < 0.15 else None
    if q is not None and len(p.text) + len(q.text) <= LONG_CHARS:
        t = _pick(rng, P.SUMMARIZE_TWO)
        return Request("summarize", _fill(t, p=p.text, q=q.text), (p, q))
    return Request("summarize", _fill(_pick(rng, P.SUMMARIZE), **_common(rng, p), p=p.text), (p,))


def qa_context(rng: random.Random, take: Take) -> Request:
    if rng.random() < 0.3:  # several documents, the question is about one of them
        docs = _up_to(LONG_CHARS, [take(*PROSE_FORMS, "record") for _ in range(rng.randint(2, 4))])
        q = question_for(rng.choice(docs), rng)
        text = "\n\n".join(f"Document {i + 1}:\n{d.text}" for i, d in enumerate(docs))
        t = _pick(rng, P.RAG)
        return Request(
            "qa_context", _fill(t, question=q, question_lc=_lc(q), docs=text), tuple(docs)
        )
    p = take(*PROSE_FORMS, "record", "code")
    q = question_for(p, rng)
    body = f"```python\n{p.text}\n```" if p.form == "code" else p.text
    t = _pick(rng, P.QA_CONTEXT)
    return Request(
        "qa_context", _fill(t, question=q, question_lc=_lc(q), title=p.title, p=body), (p,)
    )


def qa_closed(rng: random.Random, take: Take) -> Request:
    p = take("record", "reference", "docstring", "legal")
    desc = re.search(r"Description: (.*)", p.text)
    summary = desc.group(1).strip() if desc else name_of(p)
    licences = (
        "GNU General Public License",
        "MIT License",
        "Apache License",
        "BSD licence",
        "Mozilla Public License",
        "GNU Lesser General Public License",
    )
    a, b = rng.sample(licences, 2)
    country, _ = rng.choice(W.COUNTRIES)
    fields = {
        "title": p.title or p.source,
        "cmd": p.title or "ls",
        "desc_lc": _lc(summary).rstrip("."),
        "module": name_of(p).split(".")[0],
        "licence": a,
        "licence2": b,
        "country": country,
        "concept": rng.choice(W.STEM_CONCEPTS + W.HUMANITIES_CONCEPTS),
        "animal": rng.choice(W.ANIMALS),
    }
    return Request("qa_closed", _fill(_pick(rng, P.Q_CLOSED), **fields), (p,))


def extract(rng: random.Random, take: Take) -> Request:
    p = take(*PROSE_FORMS, "record", "code")
    specific = P.EXTRACT_FORM.get(p.form, ())
    bank = specific if specific and (rng.random() < 0.6 or p.form == "code") else P.EXTRACT
    return Request("extract", _fill(_pick(rng, bank), title=name_of(p), p=p.text), (p,))


def rewrite(rng: random.Random, take: Take) -> Request:
    p = take(*PROSE_FORMS, "record")
    specific = P.REWRITE_FORM.get(p.form, ())
    bank = specific if specific and rng.random() < 0.4 else P.REWRITE
    return Request("rewrite", _fill(_pick(rng, bank), **_common(rng, p), p=p.text), (p,))


def translate(rng: random.Random, take: Take) -> Request:
    """Into English from translated manuals and messages (55%), else from English into another
    language; often only 1-3 sentences, like a user pasting one line."""
    if rng.random() < 0.55:
        p = take("foreign")
        src = P.LANG_NAMES.get(p.lang, p.lang)
        bank = P.TRANSLATE_FROM if rng.random() < 0.95 else P.TRANSLATE_FROM[-1:]
        lang = rng.choice([x for x in P.LANGS if x != src])
    else:
        p = take("prose", "docstring", "reference", "changelog")
        src, bank, lang = "English", P.TRANSLATE_TO, _pick(rng, P.LANGS)
    text = p.text
    sents = sentences(text)
    if len(sents) > 3 and rng.random() < 0.6:
        i = rng.randrange(len(sents) - 2)
        text = " ".join(sents[i : i + rng.randint(1, 3)])
    return Request(
        "translate", _fill(_pick(rng, bank), src=src, lang=lang, title=p.title, p=text), (p,)
    )


def code_explain(rng: random.Random, take: Take) -> Request:
    p = take("code")
    ask = _fill(_pick(rng, P.CODE_EXPLAIN), lang=_pick(rng, P.CODE_LANGS))
    code = f"```python\n{p.text}\n```"
    user = f"{ask}\n\n{code}" if rng.random() < 0.8 else f"{code}\n\n{ask}"
    return Request("code_explain", user, (p,))


def code_write(rng: random.Random, take: Take) -> Request:
    if rng.random() < 0.3:
        p = take("record")
        desc = re.search(r"Description: (.*)", p.text)
        summary = (desc.group(1).strip() if desc else p.title).rstrip(".")
        t = _pick(rng, P.CODE_WRITE_TOOL)
        fields = {
            "title": p.title,
            "summary": summary,
            "summary_lc": _lc(summary),
            "lang": _pick(rng, P.CODE_LANGS),
        }
        return Request("code_write", _fill(t, **fields), (p,))
    p = take("docstring")
    sig = (
        p.title.split(".")[-1]
        if "(" not in p.title
        else p.title[len(name_of(p).rsplit(".", 1)[0]) + 1 :]
    )
    t = _pick(rng, P.CODE_WRITE)
    return Request(
        "code_write",
        _fill(t, sig=sig, name=name_of(p), lang=_pick(rng, P.CODE_LANGS), p=p.text),
        (p,),
    )


def math(rng: random.Random, take: Take) -> Request:
    """Word problems on real package sizes and versions (60%), else the project's templates."""
    if rng.random() < 0.4:
        gen = I.math_problem if rng.random() < 0.7 else I.reasoning
        return Request("math", I.fix_articles(gen(rng)))
    recs = [take("record") for _ in range(3)]
    size = [
        int(m.group(1)) if (m := re.search(r"Installed-Size: (\d+)", r.text)) else 100 for r in recs
    ]
    y1 = rng.randint(1995, 2015)
    fields = {
        "a": recs[0].title,
        "b": recs[1].title,
        "c": recs[2].title,
        "x": size[0],
        "y": size[1],
        "z": size[2],
        "r": rng.choice((50, 120, 250, 800, 1500)),
        "n": rng.randint(3, 400),
        "v1": f"{rng.randint(0, 3)}.{rng.randint(0, 9)}",
        "v2": f"{rng.randint(4, 9)}.{rng.randint(0, 9)}",
        "y1": y1,
        "y2": y1 + rng.randint(2, 10),
    }
    extra = rng.choice(("", "", " Show your work.", " Explain each step.", " Answer briefly."))
    return Request("math", _fill(_pick(rng, P.MATH_REAL), **fields) + extra, tuple(recs))


def _topic(rng: random.Random, take: Take) -> tuple[str, Passage | None, dict[str, object]]:
    """A topic for open requests: a package's one-line description, a command, a module, or one
    of the project's everyday topics (lexicon)."""
    r = rng.random()
    if r < 0.55:
        p = take("record")
        desc = re.search(r"Description: (.*)", p.text)
        summary = (desc.group(1).strip() if desc else p.title).rstrip(".")
        ver = re.search(r"Version: (\S+)", p.text)
        topic = rng.choice((f"the {p.title} package", f"{p.title} ({_lc(summary)})"))
        return (
            topic,
            p,
            {"title": p.title, "summary": summary, "ver": ver.group(1) if ver else "1.0"},
        )
    if r < 0.75:
        p = take("reference", "docstring")
        what = "command" if p.form == "reference" else "function"
        return f"the `{name_of(p)}` {what}", p, {"title": name_of(p), "summary": "", "ver": "2.0"}
    return rng.choice(W.TOPICS), None, {"title": rng.choice(W.TOPICS), "summary": "", "ver": "1.0"}


def chat(rng: random.Random, take: Take) -> Request:
    topic, p, f = _topic(rng, take)
    t = _pick(rng, P.CHAT)
    if "{summary}" in t and not f["summary"]:
        t = P.CHAT[0]
    user = _fill(
        t,
        topic=topic,
        n=rng.randint(3, 7),
        audience=_pick(rng, P.AUDIENCES),
        character=rng.choice(W.CHARACTERS),
        **f,
    )
    return Request("chat", user, (p,) if p else ())


def roleplay(rng: random.Random, take: Take) -> Request:
    topic, p, f = _topic(rng, take)
    persona = _fill(_pick(rng, P.PERSONAS), **f)
    request = _pick(rng, P.ROLEPLAY_REQUESTS)
    if "{summary}" in request and not f["summary"]:
        request = P.ROLEPLAY_REQUESTS[0]
    used: tuple[Passage, ...] = (p,) if p else ()
    q = take("prose", "reference", "docstring") if "{p}" in request else None
    used += (q,) if q else ()
    request = _fill(request, topic=topic, **f, p=q.text if q else "")  # the passage goes in last
    if rng.random() < 0.3:
        system = _fill(_pick(rng, P.ROLEPLAY_SYSTEM), persona=persona)
        return Request("roleplay", request, used, system)
    return Request(
        "roleplay",
        f"{_fill(_pick(rng, P.ROLEPLAY), persona=persona)}".replace("{request}", request),
        used,
    )


def prompt_writing(rng: random.Random, take: Take) -> Request:
    topic, p, _ = _topic(rng, take)
    t = _pick(rng, P.PROMPT_WRITING)
    used: tuple[Passage, ...] = (p,) if p else ()
    q = take(*PROSE_FORMS) if "{p}" in t else None
    used += (q,) if q else ()
    user = _fill(t, topic=topic, audience=_pick(rng, P.AUDIENCES), p=q.text if q else "")
    return Request("prompt_writing", user, used)


def followup_text(kind: str, rng: random.Random) -> str:
    """A second user turn for a conversation whose first request was of `kind`."""
    bank = P.FOLLOWUP_KIND.get(kind, ())
    t = _pick(rng, bank) if bank and rng.random() < 0.5 else _pick(rng, P.FOLLOWUP)
    return _fill(t, lang=_pick(rng, P.LANGS + P.CODE_LANGS if "code" in kind else P.LANGS))


def written_prompt(answer: str) -> str:
    """The request the target wrote (prompt_writing's answer), cleaned to be used as a user
    message; "" when nothing usable is left (the caller then uses its fallback).

    >>> written_prompt('Question: "What is the best way to learn Rust?"\\n\\nThis question...')
    'What is the best way to learn Rust?'
    >>> written_prompt("Here's a question:\\n\\n**How do tides work?**")
    'How do tides work?'
    """
    lines = []
    for line in answer.strip().splitlines():
        line = re.sub(
            r"^\s*(\*\*)?(question|request|task|q)\s*\d*\s*[:.]\s*(\*\*)?", "", line, flags=re.I
        )
        line = line.strip().strip('"“”*').strip()
        if len(line) >= 12 and re.search(r"[A-Za-z]", line):
            lines.append(line[:400])
    asks = [ln for ln in lines if "?" in ln] or [ln for ln in lines if not ln.endswith(":")]
    return asks[0] if asks else ""


# (kind, builder, weight): the weak categories of issue 31 (translation, summarization, QA,
# rewriting) get the most.
BUILDERS: tuple[tuple[str, Callable[[random.Random, Take], Request], int], ...] = (
    ("translate", translate, 15),
    ("summarize", summarize, 13),
    ("qa_context", qa_context, 14),
    ("qa_closed", qa_closed, 8),
    ("rewrite", rewrite, 10),
    ("extract", extract, 8),
    ("code_explain", code_explain, 6),
    ("code_write", code_write, 5),
    ("math", math, 5),
    ("chat", chat, 8),
    ("roleplay", roleplay, 5),
    ("prompt_writing", prompt_writing, 5),
)
