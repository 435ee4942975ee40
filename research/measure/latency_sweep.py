"""How the speedup of speculative over plain decoding grows with the network latency of a sharded
target: `edgespec bench` on N local ranks whose ring connections run through delaying relays
(research/measure/simlink.py), once per delay, then a table and a plot.

    python -m research.measure.latency_sweep bench -n 3 --out bench-out/n3 -- --methods plain,spec -k 3
    python -m research.measure.latency_sweep make-pair /tmp/sweep-pair
    python -m research.measure.latency_sweep sweep --delays 0,0.1,0.25,0.5,1 --out docs/measurements/x \\
        -- --target /tmp/sweep-pair/target --draft /tmp/sweep-pair/draft --methods plain,spec \\
           -k 3 --max-tokens 64 --limit 1

Each delay's bench writes OUT/delay-<ms>/results.json (its `environment.distributed` holds the
measured all_sum and forward latencies); the sweep writes OUT/sweep.json, OUT/sweep.md and
OUT/speedup_vs_latency.png. The plot's curve is the prediction from the no-delay run alone:
spec over plain = tau * (t_plain + d) / (t_round + d), where d is the latency a forward gains
((collectives per forward + 1 agreement check) x the growth of a lone all_sum's measured
latency), t_plain the plain time per token and t_round the speculative time per round without
delay, and tau the tokens per round: every forward pays d, and speculation runs 1 / tau as many
target forwards per token. As d grows the speedup tends to tau.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from research.measure.simlink import free_port_block, relayed_hostfiles
from tests.helpers.tiny import (
    llama_config,
    make_tokenizer,
    random_llama_weights,
    write_model,
)


def make_pair(root: Path, layers: int = 8, hidden: int = 256, weak: float = 0.15) -> None:
    """A synthetic pair whose draft agrees often: the target's layers after the first add only
    `weak` x their output to the residual stream, the draft is the embedding + the first layer.
    Sharded N = 2 (4 heads, 2 KV heads, MLP 512)."""
    vocab = make_tokenizer(root / "tokenizer", seed=0)
    cfg = llama_config(vocab, layers, hidden=hidden)
    weights = random_llama_weights(cfg, seed=0)
    for i in range(1, layers):
        for name in ("self_attn.o_proj", "mlp.down_proj"):
            weights[f"model.layers.{i}.{name}.weight"] *= weak
    write_model(root / "target", cfg, weights, root / "tokenizer")
    draft = {k: v for k, v in weights.items() if ".layers." not in k or ".layers.0." in k}
    write_model(root / "draft", llama_config(vocab, 1, hidden=hidden), draft, root / "tokenizer")


def direct_hostfiles(folder: Path, size: int) -> tuple[list[Path], list]:
    """One ring hostfile for every rank, no relays (what mlx.launch writes, without its I/O
    threads, which poll and took ~18% of a core for a whole 3-rank bench here)."""
    base = free_port_block(size)
    path = folder / "hosts.json"
    path.write_text(json.dumps([[f"127.0.0.1:{base + r}"] for r in range(size)]))
    return [path] * size, []


def run_ranks(
    size: int, delay_ms: float | None, bench: list[str], out: Path, timeout: float
) -> dict:
    """One bench on `size` local ranks (through relays delaying `delay_ms`, or directly when
    None); returns rank 0's results.json."""
    with tempfile.TemporaryDirectory() as tmp:
        if delay_ms is None:
            files, relays = direct_hostfiles(Path(tmp), size)
        else:
            files, relays = relayed_hostfiles(Path(tmp), size, delay_ms / 1000.0)
        env = dict(os.environ, HF_HUB_OFFLINE="1")
        cmd = [sys.executable, "-m", "edgespec", "bench", *bench, "--out", str(out), "--quiet"]
        procs = [
            subprocess.Popen(cmd, env=dict(env, MLX_RANK=str(r), MLX_HOSTFILE=str(files[r])))
            for r in range(size)
        ]
        try:
            codes = [p.wait(timeout=timeout) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            for relay in relays:
                relay.close()
    if codes[0] != 0:
        raise SystemExit(f"latency_sweep: the bench at {delay_ms} ms failed (exit {codes})")
    return json.loads((out / "results.json").read_text())


def row(delay_ms: float, result: dict, k: int) -> dict:
    """The figures of one delay: latencies, plain and spec tokens/s, speedup, tau."""
    dist = result["environment"]["distributed"]
    by = {m["method"]: m["overall"] for m in result["methods"]}
    plain, spec = by["plain"], by["spec"]
    return {
        "delay_ms": delay_ms,
        "all_sum_us": dist["all_sum_us"],
        "forward_1_ms": dist["forward_ms"]["1"],
        f"forward_{k + 1}_ms": dist["forward_ms"][str(k + 1)],
        "collectives": dist["collectives"],
        "plain_tps": plain["tokens_per_s"],
        "spec_tps": spec["tokens_per_s"],
        "speedup": spec["speedup_vs_plain"],
        "tau": spec["tau"],
    }


def added_latency(rows: list[dict]) -> np.ndarray:
    """Seconds each target forward gains at each row's delay: (collectives + 1) x the growth of
    a lone all_sum's latency (the + 1: the agreement check's all_gather, once per step)."""
    base = rows[0]["all_sum_us"]
    return np.array([(r["collectives"] + 1) * (r["all_sum_us"] - base) for r in rows]) / 1e6


def predict(rows: list[dict], added: np.ndarray) -> np.ndarray:
    """Speedup at added per-forward latency `added` (s), from the first (no-delay) row alone."""
    base = rows[0]
    t_plain, tau = 1.0 / base["plain_tps"], base["tau"]
    t_round = tau / base["spec_tps"]
    return tau * (t_plain + added) / (t_round + added)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    added = added_latency(rows)
    grid = np.linspace(0.0, max(added.max(), 1e-3) * 1.3, 100)
    fig, ax = plt.subplots(figsize=(5.2, 3.4), dpi=110)
    ax.plot(1000 * grid, predict(rows, grid), "-", color="0.6", label="predicted from 0 ms")
    ax.plot(1000 * added, [r["speedup"] for r in rows], "o", color="C0", label="measured")
    for r, a in zip(rows, added, strict=True):
        ax.annotate(
            f"{r['all_sum_us'] / 1000:.1f}",
            (1000 * a, r["speedup"]),
            fontsize=7,
            xytext=(3, -9),
            textcoords="offset points",
        )
    ax.axhline(rows[0]["tau"], color="0.8", ls=":", label=f"tau = {rows[0]['tau']:.2f}")
    ax.set_xlabel("latency added to each target forward (ms)")
    ax.set_ylabel("spec / plain tokens per s")
    ax.set_title("sharded target (labels: ms per all_sum)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)


def markdown(rows: list[dict], k: int) -> str:
    head = (
        "| one-way delay (ms) | all_sum (us) | forward L=1 (ms) | forward L=K+1 (ms) | "
        "plain tok/s | spec tok/s | speedup | tau | predicted |"
    )
    added = added_latency(rows)
    lines = [head, "|" + "---|" * 9]
    for r, p in zip(rows, predict(rows, added), strict=True):
        lines.append(
            f"| {r['delay_ms']} | {r['all_sum_us']:.0f} | {r['forward_1_ms']:.1f} | "
            f"{r[f'forward_{k + 1}_ms']:.1f} | {r['plain_tps']:.1f} | {r['spec_tps']:.1f} | "
            f"{r['speedup']:.2f} | {r['tau']:.2f} | {p:.2f} |"
        )
    return "\n".join(lines) + "\n"


def sweep(args: argparse.Namespace, bench: list[str]) -> None:
    k = int(bench[bench.index("-k") + 1]) if "-k" in bench else 4
    rows = []
    for delay in args.delays:
        out = args.out / f"delay-{delay:g}"
        rows.append(row(delay, run_ranks(args.n, delay, bench, out, args.timeout), k))
        print(json.dumps(rows[-1]), flush=True)
    (args.out / "sweep.json").write_text(
        json.dumps({"bench": bench, "n": args.n, "rows": rows}, indent=1)
    )
    (args.out / "sweep.md").write_text(markdown(rows, k))
    plot(rows, args.out / "speedup_vs_latency.png")
    print(markdown(rows, k))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    mk = sub.add_parser("make-pair", help="write the synthetic sharded pair")
    mk.add_argument("folder", type=Path)
    sw = sub.add_parser("sweep", help="bench once per delay; bench arguments after --")
    sw.add_argument("--delays", default="0,0.25,0.5,1", help="one-way ms per hop, comma-separated")
    sw.add_argument("-n", type=int, default=2, help="ranks (default 2)")
    sw.add_argument("--out", type=Path, required=True)
    sw.add_argument("--timeout", type=float, default=1800.0, help="seconds per bench")
    one = sub.add_parser(
        "bench", help="one bench on N direct local ranks; bench arguments after --"
    )
    one.add_argument("-n", type=int, default=3, help="ranks (default 3)")
    one.add_argument("--out", type=Path, required=True)
    one.add_argument("--timeout", type=float, default=7200.0, help="seconds")
    argv = sys.argv[1:]
    bench = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    if args.what == "make-pair":
        make_pair(args.folder)
        return
    if args.what == "bench":
        run_ranks(args.n, None, bench, args.out, args.timeout)
        return
    args.delays = [float(d) for d in args.delays.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    sweep(args, bench)


if __name__ == "__main__":
    main()
