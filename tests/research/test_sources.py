"""Real training prompts (issue 31): passages from this machine's text with origin and licence,
requests of every kind, a deterministic decontaminated pool split by group, and the target
answering it into resumable shards that carry each answer's kind."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from edgespec.distill import shards as D
from research.distill import debian
from research.distill import sources as S
from research.distill import tokens as T
from research.distill.passages import (
    MAX_CHARS,
    Passage,
    debian_licence,
    group_paragraphs,
    package_licence,
    python_pieces,
)
from research.distill.pool import (
    SLOTS,
    Pool,
    PoolPrompt,
    benchmark_turns,
    build_pool,
    decontaminate,
    read_pool,
    shingles,
    write_pool,
)
from research.distill.requests import KINDS, written_prompt
from tests.helpers.prompt_sets import MT_BENCH, SPEC_BENCH, given_turns

CAPS = S.Caps(per_file=4, gettext_per_file=4)
GROUPS = 1500


@pytest.fixture(scope="module")
def passages() -> list[Passage]:
    """Real passages from the fast collections (no manual pages: rendering them takes minutes)."""
    lic = debian.debian_licences()
    owners = debian.dpkg_owners()
    out = S.unique(
        [
            S.stdlib_passages(CAPS, seed=0),
            debian.debian_doc_passages(CAPS, 0, lic),
            debian.licence_passages(),
            debian.dpkg_records(lic),
            debian.gettext_passages(CAPS, 0, owners, lic),
        ]
    )
    forms = {p.form for p in out}
    if not {"docstring", "code", "record", "foreign"} <= forms:
        pytest.skip(f"this machine lacks some real text (has {sorted(forms)})")
    return out


@pytest.fixture(scope="module")
def pool(passages):  # type: ignore[no-untyped-def]
    return build_pool(passages, GROUPS, seed=0, benchmark=given_turns())


# ----------------------------------------------------------------------------- passages


def test_paragraph_groups_stay_within_bounds() -> None:
    paras = [("word " * n).strip() for n in (30, 90, 400, 12, 70, 250)]
    chunks = list(group_paragraphs(paras, lo=300, hi=900))
    assert chunks and all(300 <= len(c) <= 900 for c in chunks)


def test_python_pieces_finds_docstrings_signatures_and_bodies() -> None:
    src = (
        '"""Module about geometry."""\n\nclass Box:\n    """A box."""\n\n'
        "    @staticmethod\n    def area(w: int, h: int = 2) -> int:\n"
        '        """Width times height."""\n        return w * h\n'
    )
    got = {(p.kind, p.signature) for p in python_pieces(src, "geo")}
    assert got == {
        ("module-doc", "geo"),
        ("doc", "Box"),
        ("doc", "Box.area(w: int, h: int=2)"),
        ("code", "Box.area(w: int, h: int=2)"),
    }
    code = next(p.text for p in python_pieces(src, "geo") if p.kind == "code")
    assert code.startswith("@staticmethod\ndef area(")  # decorator kept, dedented


def test_licences_are_read_from_metadata_and_copyright_files() -> None:
    assert package_licence("BSD-3-Clause", "", []) == "BSD-3-Clause"
    assert package_licence("", "", ["License :: OSI Approved :: Apache Software License"]) == (
        "Apache-2.0"
    )
    assert package_licence("", "UNKNOWN", []) == ""
    assert (
        debian_licence(
            "This program is free software under the GNU General Public License, version 2."
        )
        == "GPL-2"
    )
    dep5 = "Format: x\n\nFiles: debian/*\nLicense: GPL-2+\n\nFiles: *\nLicense: MIT\n"
    assert debian_licence(dep5) == "MIT"  # the Files: * stanza, not debian/'s
    assert debian_licence("Files: *\nLicense: BSD-3-clause or GPL-2\n") == "BSD-3-clause or GPL-2"
    # A License: line with prose (or nothing) after it is no licence name; the text decides.
    assert debian_licence("License:\n tests/a.c\n") == ""
    assert (
        debian_licence(
            "License: Different licenses apply to different files here.\n"
            "Permission is hereby granted, free of charge, to any person"
        )
        == "Expat"
    )


def test_collections_are_deterministic_and_record_origin_and_licence(passages) -> None:  # type: ignore[no-untyped-def]
    again = list(S.stdlib_passages(CAPS, seed=0))
    assert S.unique([again]) == [p for p in passages if p.source == "python-stdlib"]
    assert again != list(S.stdlib_passages(CAPS, seed=1))
    for p in passages:
        assert p.source and p.origin and p.licence and p.form and p.text.strip()
        assert len(p.text) <= 2600
    stdlib = [p for p in passages if p.source == "python-stdlib"]
    assert {p.licence for p in stdlib} == {"PSF-2.0"}
    assert all(Path(p.origin.split(":")[0]).is_file() for p in stdlib[:50])
    assert len({p.text for p in passages}) == len(passages)  # no duplicates


# ----------------------------------------------------------------------------- pool


def test_every_kind_is_represented(pool) -> None:  # type: ignore[no-untyped-def]
    kinds = {p.kind for p in pool.prompts}
    assert kinds == set(KINDS)
    translate = [p for p in pool.prompts if p.kind == "translate"]
    assert any("English" in p.user for p in translate)  # into English from other languages
    assert any(re.search(r"\binto (French|Spanish|German|Chinese)", p.user) for p in translate)


def test_pool_is_deterministic_and_its_file_round_trips(passages, pool, tmp_path) -> None:  # type: ignore[no-untyped-def]
    again = build_pool(passages, GROUPS, seed=0, benchmark=given_turns())
    assert again.prompts == pool.prompts
    other = build_pool(passages, 50, seed=1)
    assert [p.user for p in other.prompts[:20]] != [p.user for p in pool.prompts[:20]]
    sha = write_pool(pool, tmp_path / "a.jsonl.gz")
    assert write_pool(again, tmp_path / "b.jsonl.gz") == sha
    back, sha_back = read_pool(tmp_path / "a.jsonl.gz")
    assert sha_back == sha and back.prompts == pool.prompts and back.seed == 0


def test_a_pool_and_a_question_file_may_hold_raw_unicode_line_separators(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """JSON lines end at "\n" only: U+2028 and U+0085 are valid raw inside a JSON string."""
    text = "one\u2028two\x85three"
    pool = Pool(
        seed=1, eval_fraction=0.5, prompts=[PoolPrompt(0, "qa", text), PoolPrompt(1, "qa", "x")]
    )
    write_pool(pool, tmp_path / "pool.jsonl.gz")
    assert [p.user for p in read_pool(tmp_path / "pool.jsonl.gz")[0].prompts] == [text, "x"]
    row = {"question_id": 1, "turns": [text]}
    (tmp_path / "q.jsonl").write_text(json.dumps(row, ensure_ascii=False) + "\n", "utf-8")
    assert benchmark_turns(tmp_path) == [text]


def test_prompts_record_where_their_text_came_from(pool) -> None:  # type: ignore[no-untyped-def]
    needs_text = set(KINDS) - {"math", "chat", "roleplay", "prompt_writing", "followup"}
    by_id = pool.by_id()
    for p in pool.prompts:
        if p.kind in needs_text:
            assert p.sources, p
        if p.kind == "followup":  # the conversation quotes what its first turn quoted
            assert p.sources == by_id[p.parent].sources
        for source, origin, licence in p.sources:
            assert source and origin and licence


def test_no_template_field_is_left_unfilled(passages, pool) -> None:  # type: ignore[no-untyped-def]
    texts = {p.origin: p.text for p in passages}
    fields = re.compile(
        r"\{(p|q|docs|question|question_lc|title|audience|tone|recipient|lang|n|w|"
        r"name|kw|opt|ver|sig|summary|summary_lc|topic|persona|request|src|cmd|"
        r"desc_lc|module|licence|licence2|country|concept|animal|character|"
        r"x|y|z|a|b|c|r|v1|v2|y1|y2)\}"
    )
    for p in pool.prompts:
        for m in set(fields.findall(p.user + p.system + p.fallback)):
            quoted = [texts.get(o, "") for _, o, _ in p.sources]
            assert any("{" + m + "}" in t for t in quoted), (m, p.user[:300])


def test_no_prompt_contains_benchmark_text(pool) -> None:  # type: ignore[no-untyped-def]
    turns = given_turns()
    if not turns:
        pytest.skip(f"needs a public prompt set: set {MT_BENCH} or {SPEC_BENCH}")
    bad: set[str] = set()
    for t in turns:
        bad |= shingles(t)
    long_turns = [t.strip() for t in turns if len(t.strip()) >= 40]
    for p in pool.prompts:
        text = "\n".join((p.user, p.system, p.fallback))
        assert not shingles(text) & bad, p.user[:200]
        assert not any(t in text for t in long_turns)


def test_decontamination_drops_a_passage_that_quotes_a_benchmark_turn() -> None:
    turns = given_turns()
    if not turns:
        pytest.skip(f"needs a public prompt set: set {MT_BENCH} or {SPEC_BENCH}")
    turn = max(turns, key=len)
    quote = " ".join(turn.split()[:14])  # only in memory, for this check
    clean = Passage("An unrelated paragraph about tar archives. " * 10, "t", "o1", "MIT", "prose")
    dirty = Passage(f"Some text. {quote} More text.", "t", "o2", "MIT", "prose")
    kept, dropped = decontaminate([clean, dirty], turns)
    assert kept == [clean] and dropped == 1


def test_split_is_by_group_and_held_out_groups_quote_only_held_out_text(pool) -> None:  # type: ignore[no-untyped-def]
    by_group: dict[int, set[bool]] = {}
    for p in pool.prompts:
        by_group.setdefault(p.group, set()).add(pool.is_held_out(p.id))
    assert all(len(v) == 1 for v in by_group.values())
    held = {s for p in pool.prompts if pool.is_held_out(p.id) for s in p.sources}
    train = {s for p in pool.prompts if not pool.is_held_out(p.id) for s in p.sources}
    assert held and not {o for _, o, _ in held} & {o for _, o, _ in train}


def test_continuations_follow_their_parent_in_the_same_group(pool) -> None:  # type: ignore[no-untyped-def]
    by_id = pool.by_id()
    kids = [p for p in pool.prompts if p.parent >= 0]
    assert kids
    for k in kids:
        parent = by_id[k.parent]
        assert parent.group == k.group and parent.id % SLOTS == 0 and k.id % SLOTS == 1
        assert (k.kind == "self_written") == (parent.kind == "prompt_writing")
        if k.kind == "self_written":
            assert not k.user and k.fallback


def test_written_prompt_takes_the_question_or_nothing() -> None:
    assert written_prompt("Sure! Here is one:\n\nWhat makes sourdough rise?") == (
        "What makes sourdough rise?"
    )
    assert written_prompt("Request: Summarize the history of tea.") == (
        "Summarize the history of tea."
    )
    assert written_prompt("ok") == ""


# ----------------------------------------------------------------------------- generation


@pytest.fixture(scope="module")
def answered(tmp_path_factory, passages):  # type: ignore[no-untyped-def]
    """A tiny target answers a small pool (with follow-ups) into a data folder."""
    from edgespec.distill.target import load_target
    from research.distill.realdata import generate_pool_data, pool_meta
    from tests.helpers.tiny import make_tiny_pair

    root = tmp_path_factory.mktemp("real")
    target_dir, _ = make_tiny_pair(root / "pair", seed=5)
    target = load_target(str(target_dir))
    small = [p for p in passages if len(p.text) < 500]
    tiny_pool = build_pool(small, 40, seed=0, eval_fraction=0.15, followup_rate=0.6)
    sha = write_pool(tiny_pool, root / "pool.jsonl.gz")
    plan = D.SamplingPlan(max_new_tokens=12, top_k_saved=4)
    meta = pool_meta(tiny_pool, sha, str(target_dir), D.Meta(target="", n_eval=2, sampling=plan))
    out = generate_pool_data(
        target.model,
        target.tokenizer,
        root / "data",
        tiny_pool,
        meta,
        tokens=200,
        batch_size=8,
        shard_size=10,
    )
    return target, tiny_pool, meta, root / "data", out


def test_shards_carry_kinds_and_meta_names_them(answered) -> None:  # type: ignore[no-untyped-def]
    _, pool, _, data_dir, meta = answered
    by_id = pool.by_id()
    assert meta.kinds == list(KINDS) and meta.id_stride == SLOTS
    assert meta.prompt_set.startswith("pool:") and meta.n_completion_tokens >= 200
    for path in D.shard_paths(data_dir):
        with np.load(path) as z:
            got = [KINDS[k] for k in z["kinds"]]
            assert got == [by_id[int(i)].kind for i in z["instr_ids"]]


def test_a_followup_prompt_holds_its_parents_answer(answered) -> None:  # type: ignore[no-untyped-def]
    from research.distill.realdata import answer_text

    target, pool, _, data_dir, _ = answered
    seqs = {s.instr_id: s for s in T.iter_sequences(data_dir)}
    shard_of = {
        int(i): k for k, p in enumerate(D.shard_paths(data_dir)) for i in np.load(p)["instr_ids"]
    }
    kids = [p for p in pool.prompts if p.parent >= 0 and p.id in seqs]
    assert kids
    tok = target.tokenizer
    for k in kids:
        parent = seqs[k.parent]
        assert shard_of[k.id] > shard_of[k.parent]
        prompt = tok.decode(seqs[k.id].ids[: seqs[k.id].prompt_len].tolist())
        if k.kind == "followup":
            assert answer_text(tok, parent) in prompt and k.user in prompt
            first_user = tok.decode(parent.ids[: parent.prompt_len].tolist())
            assert pool.by_id()[k.parent].user in first_user


def test_held_out_groups_come_first_greedy_and_split_back(answered) -> None:  # type: ignore[no-untyped-def]
    from edgespec.distill.train import split_data

    _, pool, meta, data_dir, _ = answered
    seqs = list(T.iter_sequences(data_dir))
    train, held = split_data(seqs, meta)
    assert held and train
    assert {s.instr_id for s in held} == {s.instr_id for s in seqs if pool.is_held_out(s.instr_id)}
    first = D.read_shard(D.shard_paths(data_dir)[0])
    assert pool.is_held_out(first[0].instr_id)
    assert all((s.topk_ids[:, 0] == s.ids[s.prompt_len :]).all() for s in held)


def test_generation_resumes_and_finishes_pending_continuations(answered, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from research.distill.realdata import generate_pool_data

    target, pool, meta, data_dir, _ = answered
    before = {p.name: p.stat().st_mtime_ns for p in D.shard_paths(data_dir)}
    same = generate_pool_data(
        target.model,
        target.tokenizer,
        data_dir,
        pool,
        meta,
        tokens=200,
        batch_size=8,
        shard_size=10,
    )
    assert {p.name: p.stat().st_mtime_ns for p in D.shard_paths(data_dir)} == before
    copy = tmp_path / "data"
    shutil.copytree(data_dir, copy)
    D.shard_paths(copy)[-1].unlink()  # killed before the last shard was written
    more = generate_pool_data(
        target.model, target.tokenizer, copy, pool, meta, tokens=400, batch_size=8, shard_size=10
    )
    ids = [s.instr_id for s in T.iter_sequences(copy)]
    assert len(ids) == len(set(ids)) == more.n_sequences > same.n_sequences
    done = set(ids)
    # Every continuation whose parent was answered before the last shard is answered too.
    last = {int(i) for i in np.load(D.shard_paths(copy)[-1])["instr_ids"]}
    for p in pool.prompts:
        if p.parent in done and p.parent not in last:
            assert p.id in done


def test_another_pool_is_refused_and_old_meta_still_reads(answered, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from edgespec.errors import ConfigError
    from research.distill.realdata import generate_pool_data, pool_meta

    target, pool, meta, data_dir, _ = answered
    other = pool_meta(pool, "0" * 64, meta.target, meta)
    with pytest.raises(ConfigError, match="prompt_set"):
        generate_pool_data(target.model, target.tokenizer, data_dir, pool, other, tokens=10)
    old = tmp_path / "old"
    old.mkdir()
    raw = {"target": "t", "instruction_seed": 0, "n_instructions": 10, "n_sequences": 0}
    (old / "meta.json").write_text(json.dumps(raw))
    m = D.Meta.read(old)
    assert (m.prompt_set, m.id_stride, m.kinds) == ("instructions", 1, [])


def test_export_keeps_token_ids_and_kinds_only(answered, tmp_path) -> None:  # type: ignore[no-untyped-def]
    _, _, _, data_dir, _ = answered
    T.export_tokens(data_dir, tmp_path / "compact")
    src, dst = D.shard_paths(data_dir)[0], D.shard_paths(tmp_path / "compact")[0]
    with np.load(src) as a, np.load(dst) as b:
        assert set(b.files) == {"tokens", "starts", "prompt_lens", "instr_ids", "kinds"}
        assert all((a[k] == b[k]).all() for k in b.files)
    assert D.Meta.read(tmp_path / "compact").kinds == list(KINDS)
    before = {p: p.stat().st_mtime_ns for p in D.shard_paths(tmp_path / "compact")}
    T.export_tokens(data_dir, tmp_path / "compact")  # again: unchanged shards are not rewritten
    assert {p: p.stat().st_mtime_ns for p in D.shard_paths(tmp_path / "compact")} == before


def test_passages_are_short_enough_to_answer_cheaply(pool) -> None:  # type: ignore[no-untyped-def]
    roots = [p for p in pool.prompts if p.parent < 0]
    assert max(len(p.user) for p in roots) < 2 * 2600 + 400
    assert np.median([len(p.user) for p in roots]) < MAX_CHARS


def test_manifest_lists_the_origin_and_licence_of_every_answered_prompt(answered, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import gzip

    from research.recipes.real_data import card_tables, write_manifest

    _, pool, _, data_dir, meta = answered
    pool_path = tmp_path / "pool.jsonl.gz"
    write_pool(pool, pool_path)
    n = write_manifest(pool_path, data_dir, tmp_path / "sources.tsv.gz")
    rows = gzip.decompress((tmp_path / "sources.tsv.gz").read_bytes()).decode().splitlines()[2:]
    assert len(rows) == n and {int(r.split("\t")[0]) for r in rows} == D.done_ids(data_dir)
    quoting = [r.split("\t") for r in rows if r.split("\t")[2]]
    assert quoting and all(len(r) == 5 and r[4] for r in quoting)
    card = card_tables(pool_path, data_dir)
    assert f"| all | {meta.n_sequences:,} | {meta.n_completion_tokens:,} |" in card
