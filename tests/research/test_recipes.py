"""research/recipes/import_draft.py: joining the GPU calls' curves and appending the GPU's data."""

from __future__ import annotations

import numpy as np

from edgespec.distill import shards as D
from research.recipes.import_draft import add_gpu_data, curve_rows


def report(curve: list[tuple[int, int, float, float]], tokens: int) -> dict:
    return {
        "completion_tokens": tokens,
        "curve": [{"step": s, "tokens_seen": n, "agreement": [a, b]} for s, n, a, b in curve],
    }


def test_curve_rows_add_up_across_resumed_calls():
    first = report([(0, 0, 0.0, 0.1), (100, 1000, 0.3, 0.2), (150, 1500, 0.4, 0.25)], 700)
    second = report([(0, 0, 0.4, 0.25), (100, 900, 0.5, 0.3), (120, 1100, 0.55, 0.31)], 900)
    rows = curve_rows([first, second], column=1)
    assert [r["step"] for r in rows] == [0, 100, 150, 250, 270]
    assert [r["tokens_seen"] for r in rows] == [0, 1000, 1500, 2400, 2600]
    assert [r["agreement"] for r in rows] == [0.1, 0.2, 0.25, 0.3, 0.31]
    assert [r["data_tokens"] for r in rows] == [700, 700, 700, 900, 900]


def test_gpu_data_becomes_the_next_shard_with_fresh_counts(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    D.write_shard(data_dir, 0, [D.Sequence(3, 2, np.array([5, 6, 7]))])
    D.Meta(target="t", n_instructions=50).write(data_dir)
    gpu = [D.Sequence(40, 1, np.array([8, 9, 2])), D.Sequence(90, 2, np.array([1, 4, 4, 2]))]
    np.savez_compressed(tmp_path / "gpu.npz", **D.pack(gpu))

    meta = add_gpu_data(tmp_path / "gpu.npz", data_dir, n_instructions=150)

    assert [p.name for p in D.shard_paths(data_dir)] == ["shard-00000.npz", "shard-00001.npz"]
    back = D.read_shard(data_dir / "shard-00001.npz")
    assert [(s.instr_id, s.prompt_len, s.ids.tolist()) for s in back] == [
        (40, 1, [8, 9, 2]),
        (90, 2, [1, 4, 4, 2]),
    ]
    assert (meta.n_sequences, meta.n_tokens, meta.n_completion_tokens) == (3, 10, 5)
    assert meta.shards == 2 and meta.n_instructions == 150
    assert D.Meta.read(data_dir).n_completion_tokens == 5


def test_the_recipes_find_the_drafts_they_continue():
    """The recipes name the drafts they continue by their folders in the repository: the token
    draft's in models/, the first feature draft's beside its recipe in research/recipes/."""
    from research.recipes import draft_r2, eagle3_cpu, eagle_cpu

    assert (draft_r2.DRAFT / "config.json").is_file()
    assert (draft_r2.DRAFT / "data-real-gpu" / "meta.json").is_file()
    assert (eagle_cpu.TOKEN_DRAFT / "model.safetensors").is_file()
    assert (eagle3_cpu.OLD_EAGLE / "model.safetensors").is_file()
