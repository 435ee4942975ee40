"""`edgespec bench --context`: long prompts of the project's own text, decode runs from a
prefilled cache, the per-length fields of results.json, acceptance by answer position, the
refusals, and plots a person can read (a legend, not labels piled on each other)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from edgespec.bench.context import KINDS, build_prompts, parse_lengths
from edgespec.bench.records import RunRecord, aggregate
from edgespec.bench.report import plot_landscape
from edgespec.commands import bench as bench_command
from edgespec.errors import ConfigError
from tests.helpers.bench import check_schema
from tests.helpers.cli import mlx_lm_stopper, run_edgespec

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from tests.helpers.tiny import make_tiny_pair

    return make_tiny_pair(tmp_path_factory.mktemp("pair"), seed=0, draft="subset")


def test_lengths_parse_in_thousands_and_bad_ones_are_refused() -> None:
    assert parse_lengths("1k,4k,8k") == (1000, 4000, 8000)
    assert parse_lengths("512, 1.5k,512") == (512, 1500)
    for bad in ("eight", "8m", "10", ""):
        with pytest.raises(ConfigError, match="--context"):
            parse_lengths(bad)


def test_long_prompts_are_real_text_cut_to_length_with_the_task_last(tiny) -> None:
    from mlx_lm.tokenizer_utils import load

    tokenizer = load(tiny[0])

    def encode(messages: list[dict[str, str]]) -> list[int]:
        return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True))

    prompts = build_prompts(KINDS, (200, 450), encode)
    assert [p.id for p in prompts] == [f"{k}@{n}" for n in (200, 450) for k in KINDS]
    for p in prompts:
        assert 0.75 * p.length <= len(p.ids) <= p.length, (p.id, len(p.ids))
        text = tokenizer.decode(list(p.ids))
        lines = [x for x in text.splitlines() if x.strip() and not x.startswith("<|im_start|>")]
        assert len(set(lines)) >= 0.9 * len(lines)  # real text, not one passage repeated
        assert "assistant" in text[-40:]  # ready for the answer ...
        assert {
            "doc": "Summarize the document",
            "code": "Explain what the code",
            "chat": ("Summarize our conversation"),
        }[p.kind] in text[-300:]  # ... right after the instruction
    chat = tokenizer.decode(list(prompts[-1].ids))
    assert chat.count("<|im_start|>assistant") >= 3  # a conversation of several turns
    code = tokenizer.decode(list(prompts[-2].ids))
    assert "# file: edgespec/" in code  # the package's own source


def _plan(*argv: str) -> object:
    parser = argparse.ArgumentParser()
    bench_command.add_arguments(parser)
    return bench_command._plan(parser.parse_args(list(argv)))


def test_long_answers_get_acceptance_by_position_by_default() -> None:
    assert _plan("--max-tokens", "2048").position_width == 256  # type: ignore[attr-defined]
    assert _plan("--max-tokens", "128").position_width == 0  # type: ignore[attr-defined]
    assert _plan("--by-position", "64").position_width == 64  # type: ignore[attr-defined]
    assert _plan("--max-tokens", "600", "--by-position", "0").position_width == 0  # type: ignore[attr-defined]


def test_cli_context_sweep_writes_per_length_and_per_position_results(tiny, tmp_path) -> None:
    target, draft = tiny
    out = tmp_path / "out"
    proc = run_edgespec(
        "bench",
        "--target", str(target), "--draft", str(draft), "--draft-bits", "0",
        "--context", "200,450", "--context-kinds", "doc,chat",
        "--methods", "plain,spec,mlx-lm", "-k", "2", "--max-tokens", "24",
        "--by-position", "8", "--out", str(out), "--quiet",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "context" in proc.stdout and "TTFT s" in proc.stdout
    doc = json.loads((out / "results.json").read_text())
    check_schema(doc)
    assert doc["settings"]["context"] == [200, 450]
    assert set(doc["settings"]["context_prompt_tokens"]) == {
        "doc@200",
        "chat@200",
        "doc@450",
        "chat@450",
    }
    contexts = {c["label"]: c for c in doc["contexts"]}
    assert list(contexts) == ["200", "450"]
    for c in contexts.values():
        rows = {m["method"]: m["overall"] for m in c["methods"]}
        assert set(rows) == {"plain", "spec", "mlx-lm"}
        assert rows["plain"]["speedup_vs_plain"] == pytest.approx(1.0)
        spec = rows["spec"]
        for key in ("tokens_per_s", "speedup_vs_plain", "tau", "c", "v", "ttft"):
            assert spec[key] is not None and spec[key] > 0, key
        assert rows["mlx-lm"]["tau"] is not None and rows["mlx-lm"]["tau"] >= 1
        assert all(r["peak_memory_mb"] > 0 for r in rows.values())
    runs = doc["runs"]
    # one measured run per method and prompt; each decoded from the prefilled cache, yet the same
    # tokens as plain decoding from scratch (greedy identity holds on the reused prefix)
    assert len(runs) == 3 * 4 and {r["context"] for r in runs} == {200, 450}
    plain = {r["prompt_id"]: r["token_ids"] for r in runs if r["method"] == "plain"}
    for r in runs:
        assert r["prompt_tokens"] == doc["settings"]["context_prompt_tokens"][r["prompt_id"]]
        assert r["ttft"] > 0
        if r["method"] == "spec":
            assert r["token_ids"] == plain[r["prompt_id"]] and r["mismatch"] is False
    assert all(m["near_tie"] for m in doc["mismatches"])  # mlx-lm: near-ties at most
    positions = doc["positions"]
    assert positions["width"] == 8
    by_method = {m["method"]: m["spans"] for m in positions["methods"]}
    assert set(by_method) == {"spec", "mlx-lm"}
    spans = by_method["spec"]
    assert [s["start"] for s in spans] == [0, 8, 16][: len(spans)] and len(spans) >= 2
    assert sum(s["tokens"] for s in spans) == sum(
        r["tokens"] for r in runs if r["method"] == "spec"
    )
    assert all(s["tau"] >= 1 for s in spans if s["rounds"])
    for name in ("speedup_by_context.png", "acceptance_by_position.png"):
        assert (out / name).read_bytes()[:8] == PNG_MAGIC


@pytest.mark.parametrize(
    "args, needle",
    [
        (
            ["--context", "1k"],
            "--context 1k needs 1000 + 128 new tokens, beyond the context window",
        ),
        (["--context", "400", "--max-tokens", "200"], "needs 400 + 200 new tokens"),
        (["--context", "lots"], "--context takes token counts"),
        (["--context", "200", "--context-kinds", "poems"], "--context-kinds takes doc, code, chat"),
    ],
)
def test_cli_contexts_beyond_the_window_are_refused_before_anything_loads(
    tiny, tmp_path: Path, args: list[str], needle: str
) -> None:
    target, draft = tiny
    out = tmp_path / "out"
    proc = run_edgespec(
        "bench", "--target", str(target), "--draft", str(draft), *args, "--out", str(out),
        path_first=mlx_lm_stopper(tmp_path),
    )  # fmt: skip
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("edgespec bench: error: ") and needle in lines[0], lines[0]
    assert not out.exists()


def test_cli_bad_context_files_get_one_line(tiny, tmp_path: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text(" \n\n")
    binary = tmp_path / "weights.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    nul = tmp_path / "nul.txt"
    nul.write_text("text\x00with a NUL")
    cases = {
        tmp_path / "missing.txt": "no such file",
        empty: "the file is empty",
        binary: "not UTF-8 text",
        nul: "not text (it holds NUL bytes)",
    }
    stopper = mlx_lm_stopper(tmp_path / "stop")
    for path, needle in cases.items():
        proc = run_edgespec(
            "bench", "--target", str(tiny[0]), "--context-file", str(path),
            "--out", str(tmp_path / "out"), path_first=stopper,
        )  # fmt: skip
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr
        assert lines[0] == f"edgespec bench: error: --context-file {path}: {needle}"


def test_landscape_names_each_variant_in_a_legend_not_on_the_map(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dozen variants measured alike used to print their labels on top of each other."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = []
    for i, method in enumerate(("plain", "spec", "hybrid", "ngram", "adaptive", "tree")):
        for temp in (0.0, 0.7):
            for k in (2, 3) if method not in ("plain", "adaptive") else (0,):
                records.append(
                    RunRecord(
                        method, k, temp, "p", "qa", 0, 33, 0.1, 1.0 - 0.01 * i, 1.1, "length",
                        rounds=0 if method == "plain" else 12, drafted=0 if method == "plain" else 24,
                        accepted=0 if method == "plain" else 9, rejections=0 if method == "plain" else 8,
                        t_draft=None if method == "plain" else 0.2,
                        t_verify=None if method == "plain" else 0.5,
                    )
                )  # fmt: skip
    variants = aggregate(records)
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    assert plot_landscape(variants, tmp_path) is not None
    (ax, *_) = figures[0].axes
    shown = [v.label for v in variants if v.overall.alpha is not None]
    assert len(shown) == 18
    legend = ax.get_legend()
    assert legend is not None
    names = [t.get_text() for t in legend.get_texts()]
    assert [n.split(":")[0] for n in names] == shown
    assert not ax.texts  # no label written on the map itself


def test_cli_context_file_is_measured_whole_or_cut(tiny, tmp_path: Path) -> None:
    """The user's own text: cut to a --context length, or whole without one."""
    target, draft = tiny
    notes = tmp_path / "notes.md"
    paragraphs = [
        f"Note {i}: the {i}th visit to the archive found box {i * 7} unopened." for i in range(7)
    ]
    notes.write_text("\n\n".join(paragraphs))
    for extra, want in (([], None), (["--context", "120"], 120)):
        out = tmp_path / f"out{len(extra)}"
        proc = run_edgespec(
            "bench", "--target", str(target), "--draft", str(draft), "--draft-bits", "0",
            "--context-file", str(notes), *extra, "--methods", "plain", "--max-tokens", "4",
            "--no-warmup", "--out", str(out), "--quiet",
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        doc = json.loads((out / "results.json").read_text())
        assert doc["settings"]["context_file"] == str(notes)
        (prompt_id, tokens), *rest = doc["settings"]["context_prompt_tokens"].items()
        assert not rest and prompt_id.startswith("file@")
        if want is None:  # whole: every paragraph is in, the task after it
            assert doc["settings"]["context"] == [tokens] and tokens > 150
        else:
            assert 0.75 * want <= tokens <= want
