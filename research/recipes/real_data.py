"""Training data from real text (issue 31): build a prompt pool on this machine's documentation and
source code, let the target answer it (resumable, for hours), describe and export the result.

    python -m research.recipes.real_data pool --out POOL.jsonl.gz --groups 60000 --exclude-prompts DIR
    python -m research.recipes.real_data generate --pool POOL.jsonl.gz --data DIR --tokens 5000000
    python -m research.recipes.real_data card --pool POOL.jsonl.gz --data DIR
    python -m research.recipes.real_data export --data DIR --dest models/smollm2-135m-draft/data-real

Run it with PYTHONPATH at the repository root. `generate` re-executes itself with the BLAS EdgeSpec
picks (edgespec/blas.py; EDGESPEC_BLAS=mkl-fast is fastest and exactness does not matter for data).
It writes a shard every --shard-size answers and one log line per shard; kill it at any time and
run the same command again to go on. The pool is read from its file, never rebuilt, so the prompt
ids in the shards keep their meaning; meta.json records the pool's sha256 and refuses another.
Benchmark prompts (the question files in --exclude-prompts) are read by `pool` only to drop
overlapping passages.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from pathlib import Path


def cmd_pool(a: argparse.Namespace) -> int:
    from research.distill.pool import benchmark_turns, build_pool, kind_counts, write_pool
    from research.distill.sources import collect

    if Path(a.out).exists() and not a.force:
        # A data folder names its pool by hash: overwriting the file would orphan its answers.
        print(f"{a.out} exists; a data job may be answering it (pass --force to replace it)")
        return 1
    t0 = time.time()
    passages = collect(a.seed, man=not a.no_man)
    bench = benchmark_turns(Path(a.exclude_prompts)) if a.exclude_prompts else []
    pool = build_pool(passages, a.groups, a.seed, a.eval_fraction, a.followup_rate, bench)
    sha = write_pool(pool, Path(a.out))
    print(f"{len(passages)} passages in {time.time() - t0:.0f}s; {len(pool.prompts)} prompts")
    print(f"info: {pool.info}")
    print(f"kinds: {kind_counts(pool.prompts)}")
    print(f"pool: {a.out} sha256 {sha}")
    return 0


def cmd_generate(a: argparse.Namespace) -> int:
    from edgespec.blas import reexec_with_blas

    reexec_with_blas(sys.argv[1:], module="research.recipes.real_data")
    from edgespec.distill.shards import Meta, SamplingPlan
    from edgespec.distill.target import load_target
    from research.distill.pool import read_pool
    from research.distill.realdata import generate_pool_data, pool_meta

    pool, sha = read_pool(Path(a.pool))
    plan = SamplingPlan(
        temperature=a.temperature,
        greedy_fraction=a.greedy_fraction,
        max_new_tokens=a.max_new_tokens,
    )
    meta = pool_meta(pool, sha, a.target, Meta(target=a.target, n_eval=a.n_eval, sampling=plan))
    target = load_target(a.target)
    data_dir = Path(a.data)
    had = Meta.read(data_dir).n_completion_tokens if (data_dir / "meta.json").exists() else 0
    clock = {"t": time.time(), "tok": had}

    def log(m: Meta) -> None:
        now = time.time()
        rate = (m.n_completion_tokens - clock["tok"]) / max(now - clock["t"], 1e-9)
        print(
            f"{time.strftime('%Y-%m-%d %H:%M:%S')} shard {m.shards - 1:05d}: {m.n_sequences} "
            f"answers, {m.n_completion_tokens} completion tokens, {rate:.1f} tok/s (this shard)",
            flush=True,
        )
        clock.update(t=now, tok=m.n_completion_tokens)

    blas = os.environ.get("EDGESPEC_BLAS_ACTIVE", "reference BLAS")
    print(
        f"{time.strftime('%Y-%m-%d %H:%M:%S')} pool {a.pool} ({sha[:16]}), data {a.data}, "
        f"{had} completion tokens already, {blas}",
        flush=True,
    )
    meta = generate_pool_data(
        target.model,
        target.tokenizer,
        Path(a.data),
        pool,
        meta,
        tokens=a.tokens,
        batch_size=a.gen_batch,
        shard_size=a.shard_size,
        on_shard=log,
    )
    print(f"done: {meta.n_sequences} answers, {meta.n_completion_tokens} completion tokens")
    return 0


def card_tables(pool_path: Path, data_dir: Path) -> str:
    """Markdown tables: answers and completion tokens per kind; prompts per source collection
    and per licence (over the answered prompts)."""
    from edgespec.distill.shards import done_ids
    from research.distill.pool import read_pool
    from research.distill.realdata import kind_counts

    pool, _ = read_pool(pool_path)
    done = done_ids(data_dir)
    rows = ["| kind | answers | completion tokens |", "|---|---|---|"]
    total = [0, 0]
    for k, (n, t) in kind_counts(data_dir).items():
        rows.append(f"| {k} | {n:,} | {t:,} |")
        total = [total[0] + n, total[1] + t]
    rows.append(f"| all | {total[0]:,} | {total[1]:,} |")
    src, lic = Counter[str](), Counter[str]()
    for p in pool.prompts:
        if p.id in done:
            for s, _, licence in set(p.sources):
                src[s.split(":")[0]] += 1
                lic[licence] += 1
    rows += ["", "| source collection | answered prompts quoting it |", "|---|---|"]
    rows += [f"| {s} | {n:,} |" for s, n in src.most_common()]
    rows += ["", "| licence | answered prompts quoting text under it |", "|---|---|"]
    rows += [f"| {s} | {n:,} |" for s, n in lic.most_common(40)]
    return "\n".join(rows) + "\n"


def cmd_card(a: argparse.Namespace) -> int:
    print(card_tables(Path(a.pool), Path(a.data)), end="")
    return 0


def write_manifest(pool_path: Path, data_dir: Path, dest: Path) -> int:
    """dest: gzip'd TSV (id, kind, source, origin, licence), one row per passage an answered
    prompt quotes (a prompt quoting nothing gets one row with empty fields); returns the rows.
    With the shards' token ids this says where every committed prompt came from."""
    import gzip

    from edgespec.distill.shards import done_ids
    from edgespec.files import atomic_write_bytes
    from research.distill.pool import read_pool

    pool, sha = read_pool(pool_path)
    done = done_ids(data_dir)
    rows = [f"# pool sha256 {sha}", "id\tkind\tsource\torigin\tlicence"]
    for p in pool.prompts:
        if p.id in done:
            rows += [f"{p.id}\t{p.kind}\t" + "\t".join(s) for s in p.sources or [("", "", "")]]
    atomic_write_bytes(dest, gzip.compress(("\n".join(rows) + "\n").encode(), mtime=0))
    return len(rows) - 2


def cmd_export(a: argparse.Namespace) -> int:
    from research.distill.tokens import export_tokens

    meta = export_tokens(Path(a.data), Path(a.dest))
    print(f"{meta.n_sequences} answers, {meta.n_completion_tokens} completion tokens -> {a.dest}")
    if a.pool:
        n = write_manifest(Path(a.pool), Path(a.data), Path(a.dest) / "sources.tsv.gz")
        print(f"{n} source rows -> {Path(a.dest) / 'sources.tsv.gz'}")
    return 0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pool", help="collect passages and build the prompt pool file")
    p.add_argument("--out", required=True)
    p.add_argument("--groups", type=int, default=60_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-fraction", type=float, default=0.02)
    p.add_argument("--followup-rate", type=float, default=0.2)
    p.add_argument("--no-man", action="store_true", help="skip manual pages (faster)")
    p.add_argument("--force", action="store_true", help="replace an existing pool file")
    p.add_argument(
        "--exclude-prompts",
        default="",
        help="folder of benchmark question files (*.jsonl) whose turns no passage may quote",
    )
    g = sub.add_parser("generate", help="the target answers the pool (resumable)")
    g.add_argument("--pool", required=True)
    g.add_argument("--data", required=True)
    g.add_argument("--target", default="smollm2-135m-instruct")
    g.add_argument("--tokens", type=int, default=5_000_000)
    g.add_argument("--gen-batch", type=int, default=32)
    g.add_argument("--shard-size", type=int, default=64)
    g.add_argument("--max-new-tokens", type=int, default=256)
    g.add_argument("--temperature", type=float, default=0.8)
    g.add_argument("--greedy-fraction", type=float, default=0.5)
    g.add_argument("--n-eval", type=int, default=48)
    c = sub.add_parser("card", help="counts per kind, source and licence (Markdown)")
    c.add_argument("--pool", required=True)
    c.add_argument("--data", required=True)
    e = sub.add_parser("export", help="token ids only (compact), e.g. into models/")
    e.add_argument("--data", required=True)
    e.add_argument("--dest", required=True)
    e.add_argument("--pool", help="also write dest/sources.tsv.gz (origin, licence per prompt)")
    return ap


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    return {"pool": cmd_pool, "generate": cmd_generate, "card": cmd_card, "export": cmd_export}[
        a.cmd
    ](a)


if __name__ == "__main__":
    sys.exit(main())
