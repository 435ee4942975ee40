"""`edgespec bench --cold`: each prompt's first answer in a fresh process, three ways per method.

Modes (each run is its own process: MLX compiles per process, so only a new one is cold):
  cold  Engine.load, then the answer at once (no warm-up): what a fresh `edgespec generate` gets.
  warm  Engine.load, Engine.warm_up (its calibration in a throwaway folder), then the answer.
  app   the chat app headless through Pilot: it loads and warms up as the app does, the prompt is
        typed, and the engine's stats of that answer are read. The app's side runs it (`python -m
        edgespec.tui.headless JOB`, APP_MODULE): the bench starts that process as it would any
        program, and imports nothing of tui/ (pyproject.toml's layers).
Per method, app / warm is the app's own cost and cold / warm the cost of a cold start: ratios of
decode tokens/s, one per prompt (runs of a prompt follow each other, the modes' order rotated per
prompt, so a change of load hits every mode alike), their median reported.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.errors import ConfigError
from edgespec.events import Finished, Round

MODES = ("cold", "warm", "app")
# The engine methods a cold run can take (edgespec.bench.methods' names), as the chat's settings.
COLD_METHODS: dict[str, SpecConfig] = {
    "plain": SpecConfig(method="none"),
    "spec": SpecConfig(method="draft", adaptive=False),
    "ngram": SpecConfig(method="ngram", adaptive=False),
    "hybrid": SpecConfig(method="hybrid", adaptive=False),
    "adaptive": SpecConfig(method="draft", adaptive=True),
    "adaptive-ngram": SpecConfig(method="ngram", adaptive=True),
    "adaptive-hybrid": SpecConfig(method="hybrid", adaptive=True),
}
DEFAULT_COLD = ("plain", "adaptive-hybrid")  # the chat's baseline and its default
# The module that runs a job in each mode, as `python -m MODULE JOB` (JOB: the ColdJob's JSON).
ENGINE_MODULE = "edgespec.bench.cold"
APP_MODULE = "edgespec.tui.headless"


@dataclass(frozen=True)
class ColdJob:
    """One run: which models (Engine.load's keywords), method, mode, prompt and settings."""

    model: dict[str, Any]
    method: str
    mode: str
    prompt_id: str
    prompt: str
    max_tokens: int
    k: int = 4
    temp: float = 0.0
    seed: int = 0
    think: bool | None = None  # --think / --no-think (None: the pair's default)

    def config(self) -> GenerationConfig:
        spec = COLD_METHODS[self.method]
        if not spec.adaptive and spec.method != "none":
            spec = dataclasses.replace(spec, k=self.k)
        sampling = SamplingConfig(temperature=self.temp, seed=self.seed)
        return GenerationConfig(sampling, spec, max_tokens=self.max_tokens)


def check_cold_methods(methods: Sequence[str]) -> tuple[str, ...]:
    """The methods as given, or ConfigError naming one a cold run cannot take."""
    bad = [m for m in methods if m not in COLD_METHODS]
    if bad:
        raise ConfigError(f"--cold runs {', '.join(COLD_METHODS)}; not {', '.join(bad)}")
    return tuple(methods)


def plan_jobs(
    model: dict[str, Any], prompts: Sequence[Any], methods: Sequence[str], **settings: Any
) -> list[ColdJob]:
    """Every (prompt, method, mode), a prompt's runs together, the modes rotated per prompt.

    >>> from types import SimpleNamespace as P
    >>> ps = [P(id="a", text="hi"), P(id="b", text="ho")]
    >>> [(j.prompt_id, j.mode) for j in plan_jobs({}, ps, ["plain"], max_tokens=8)]
    [('a', 'cold'), ('a', 'warm'), ('a', 'app'), ('b', 'warm'), ('b', 'app'), ('b', 'cold')]
    """
    jobs = []
    for i, p in enumerate(prompts):
        modes = MODES[i % len(MODES) :] + MODES[: i % len(MODES)]
        for method in methods:
            jobs += [ColdJob(model, method, m, p.id, p.text, **settings) for m in modes]
    return jobs


def _engine_answer(job: ColdJob) -> dict[str, Any]:
    from edgespec.runtime import Engine

    engine = Engine.load(**job.model)
    if job.think is not None and engine.thinking_mode() is not None:
        engine.thinking = job.think
    config = job.config()
    if job.mode == "warm":
        with tempfile.TemporaryDirectory() as tmp:
            engine.warm_up(config, Path(tmp))
    messages = [{"role": "user", "content": job.prompt}]
    events = list(engine.chat(messages, config))
    fin = events[-1]
    assert isinstance(fin, Finished)
    rounds = [e for e in events if isinstance(e, Round)]
    out = dataclasses.asdict(fin.stats) | {"reason": fin.reason}
    return out | {"plain_rounds": sum(r.drafted == 0 for r in rounds)}


def run_job(answer: Callable[[ColdJob], dict[str, Any]]) -> None:
    """This process's one run, the job given as JSON in sys.argv[1]: prints the record (the job's
    fields and the answer's stats) as one JSON line, and leaves."""
    job = ColdJob(**json.loads(sys.argv[1]))
    record = {"method": job.method, "mode": job.mode, "prompt": job.prompt_id} | answer(job)
    print(json.dumps(record), flush=True)
    # Leave without tearing down: the app's engine thread made MLX streams on a thread that is
    # gone, and MLX's exit-time clean-up of them aborted the process after the record was out.
    os._exit(0)


def spawn(job: ColdJob, timeout: float = 900.0) -> dict[str, Any]:
    """The job's run in a fresh Python process (APP_MODULE's for mode app, else this module's);
    a failure is a record with "error" (its last line)."""
    module = APP_MODULE if job.mode == "app" else ENGINE_MODULE
    cmd = [sys.executable, "-m", module, json.dumps(dataclasses.asdict(job))]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"method": job.method, "mode": job.mode, "prompt": job.prompt_id, "error": "timeout"}
    lines = done.stdout.strip().splitlines()
    if done.returncode == 0 and lines:
        return dict(json.loads(lines[-1]))
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return {"method": job.method, "mode": job.mode, "prompt": job.prompt_id, "error": tail}


def summarise(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per method: median decode tokens/s and TTFT per mode, the medians of the per-prompt
    ratios app / warm and cold / warm (tokens/s), and of the app's UI thread CPU time over its
    engine's decode time ("ui/engine", the app runs that measured it).

    >>> recs = [dict(method="m", mode=md, prompt=p, tokens_per_s=t, ttft=0.1)
    ...         for p, ts in (("a", (5, 10, 8)), ("b", (6, 12, 12))) for md, t in zip(MODES, ts)]
    >>> recs[1].update(decode_time=4.0); recs[2].update(ui_cpu_s=0.1, decode_time=5.0)
    >>> row = summarise(recs)[0]
    >>> row["app/warm"], row["cold/warm"], row["tokens_per_s"]["warm"], row["ui/engine"]
    (0.9, 0.5, 11.0, 0.02)
    """
    ok = [r for r in records if "error" not in r]
    rows = []
    for method in dict.fromkeys(r["method"] for r in ok):
        by = {(r["mode"], r["prompt"]): r for r in ok if r["method"] == method}
        row: dict[str, Any] = {"method": method, "tokens_per_s": {}, "ttft": {}}
        for mode in MODES:
            mine = [r for (m, _), r in by.items() if m == mode]
            if mine:
                row["tokens_per_s"][mode] = statistics.median(r["tokens_per_s"] for r in mine)
                row["ttft"][mode] = statistics.median(r["ttft"] for r in mine)
        for mode in ("app", "cold"):
            ratios = [
                by[(mode, p)]["tokens_per_s"] / by[("warm", p)]["tokens_per_s"]
                for (m, p) in by
                if m == "warm" and (mode, p) in by and by[("warm", p)]["tokens_per_s"] > 0
            ]
            row[f"{mode}/warm"] = round(statistics.median(ratios), 3) if ratios else None
        shares = [
            r["ui_cpu_s"] / r["decode_time"]
            for r in by.values()
            if "ui_cpu_s" in r and r.get("decode_time")
        ]
        row["ui/engine"] = round(statistics.median(shares), 4) if shares else None
        rows.append(row)
    return rows


def format_summary(rows: Sequence[dict[str, Any]]) -> str:
    """A plain-text table: one line per method."""
    head = f"{'method':<16} {'mode':<5} {'tok/s':>7} {'TTFT ms':>8}"
    lines = [head + "   app/warm  cold/warm  ui/engine"]
    for row in rows:
        for i, mode in enumerate(m for m in MODES if m in row["tokens_per_s"]):
            tps, ttft = row["tokens_per_s"][mode], row["ttft"][mode] * 1000
            name = row["method"] if i == 0 else ""
            app, cold, ui = row["app/warm"], row["cold/warm"], row.get("ui/engine")
            tail = f"   {app!s:>8}  {cold!s:>9}  {ui!s:>9}" if i == 0 else ""
            lines.append(f"{name:<16} {mode:<5} {tps:7.1f} {ttft:8.0f}{tail}")
    return "\n".join(lines)


def run_cold(jobs: Sequence[ColdJob], out: Path, quiet: bool = False) -> list[dict[str, Any]]:
    """Run every job in its own process, one after another; write cold.json into `out` (the
    records and the summary) and return the summary."""
    records = []
    for i, job in enumerate(jobs, 1):
        rec = spawn(job)
        records.append(rec)
        if not quiet:
            what = rec.get("error") or f"{rec['tokens_per_s']:.1f} tok/s"
            print(
                f"[{i}/{len(jobs)}] {job.prompt_id} {job.method} {job.mode}: {what}",
                file=sys.stderr,
            )
    rows = summarise(records)
    (out / "cold.json").write_text(json.dumps({"records": records, "summary": rows}, indent=1))
    return rows


if __name__ == "__main__":
    run_job(_engine_answer)
