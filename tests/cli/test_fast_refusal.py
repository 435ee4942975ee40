"""An unknown model is refused before the runtime is imported: the commands check their
--target / --draft / --pair with edgespec/loading/specs.py (no MLX, mlx-lm, transformers or torch)
and answer in one line, where importing the runtime first took seconds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from edgespec.errors import ModelLoadError, ModelNotFoundError
from edgespec.loading.specs import check_pair, load_catalog, spec_kind
from tests.helpers.cli import ROOT, mlx_lm_stopper, run_edgespec

UNKNOWN = (
    "model 'nosuchmodel' not found: not a folder, .gguf file, catalogue name or "
    "Hugging Face repo id"
)
HEAVY = ("mlx", "mlx_lm", "transformers", "torch", "huggingface_hub")


def stoppers(folder: Path) -> Path:
    """mlx_lm_stopper, and transformers and torch stopped the same way."""
    mlx_lm_stopper(folder)
    for name in ("transformers", "torch"):
        (folder / name).mkdir()
        (folder / name / "__init__.py").write_text(f"raise SystemExit('{name} was imported')\n")
    return folder


def refused(tmp_path: Path, command: str, *args: str) -> str:
    """Run `edgespec COMMAND ARGS` with the stoppers first; the one error line (exit 2)."""
    proc = run_edgespec(command, *args, timeout=120, path_first=stoppers(tmp_path / "stop"))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith(f"edgespec {command}: error: "), proc.stderr
    return lines[0].removeprefix(f"edgespec {command}: error: ")


@pytest.mark.parametrize("option", ["--target", "--draft"])
def test_generate_refuses_an_unknown_model_before_importing_the_runtime(tmp_path, option):
    assert refused(tmp_path, "generate", "hi", option, "nosuchmodel") == UNKNOWN


def test_generate_refuses_an_unknown_draft_of_a_good_target_before_loading_it(tmp_path, tiny_pair):
    args = ("hi", "--target", str(tiny_pair[0]), "--draft", "nosuchmodel")
    assert refused(tmp_path, "generate", *args) == UNKNOWN


@pytest.mark.parametrize("option", ["--target", "--draft"])
def test_bench_refuses_an_unknown_model_before_importing_the_runtime(tmp_path, option):
    out = tmp_path / "out"
    assert refused(tmp_path, "bench", option, "nosuchmodel", "--out", str(out)) == UNKNOWN
    assert not out.exists()


@pytest.mark.parametrize(
    "command,extra",
    [("verify", ()), ("tree-bench", ()), ("serve", ("--port", "0", "--no-warmup"))],
)
def test_other_commands_refuse_an_unknown_target_before_importing_the_runtime(
    tmp_path, command, extra
):
    assert refused(tmp_path, command, "--target", "nosuchmodel", *extra) == UNKNOWN


def test_pairs_and_local_paths_are_refused_early_too(tmp_path):
    assert "no model pair named 'nosuchpair'" in refused(
        tmp_path, "generate", "hi", "--pair", "nosuchpair"
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    said = refused(tmp_path / "b", "bench", "--target", str(empty), "--out", str(tmp_path / "o"))
    assert said == f"{empty} has no config.json (not a model folder)"
    notes = tmp_path / "notes.txt"
    notes.write_text("hi")
    said = refused(tmp_path / "c", "generate", "hi", "--draft", str(notes))
    assert said == f"{notes} is a file but not a .gguf model (pass a model folder)"


def test_a_spec_that_may_exist_goes_on_to_the_runtime(tmp_path):
    """A Hugging Face repo id is not refused by the check: the command goes on to load it."""
    stop = mlx_lm_stopper(tmp_path)
    proc = run_edgespec("generate", "hi", "--target", "some-org/some-model", path_first=stop)
    assert "mlx_lm was imported" in proc.stderr, proc.stderr


def test_spec_kind_names_what_resolve_would_and_refuses_the_rest(tmp_path):
    cat = load_catalog()
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "m.GGUF").write_bytes(b"GGUF")
    assert spec_kind(str(tmp_path / "model"), cat) == "folder"
    assert spec_kind(str(tmp_path / "m.GGUF"), cat) == "gguf"
    assert spec_kind(next(n for n, m in cat.models.items() if m.available), cat) == "catalogue"
    assert spec_kind("org/name", cat) == "hf"
    with pytest.raises(ModelNotFoundError) as err:
        spec_kind("nosuchmodel", cat)
    assert str(err.value) == UNKNOWN
    with pytest.raises(ModelLoadError, match="has no config.json"):
        spec_kind(str(tmp_path), cat)
    with pytest.raises(ModelNotFoundError, match="nosuchmodel"):
        check_pair(str(tmp_path / "model"), "nosuchmodel", None, catalog=cat)
    check_pair(str(tmp_path / "model"), "nosuchmodel", None, with_draft=False, catalog=cat)


def test_the_check_imports_no_runtime():
    code = (
        "import sys, edgespec.loading.specs; "
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert proc.stdout.strip() == "[]"
