"""Shared fixtures: tiny seeded model pairs written once per test session (milliseconds to make).

tiny_pair        -> (target_path, draft_path): 4-layer target, draft = its embedding + first layer
tiny_self_pair   -> (target_path, draft_path): the draft is an exact copy of the target
tiny_models      -> (target, draft) records loaded once per session (tiny_self_models likewise)
engine           -> a fresh Engine (empty caches) over tiny_models; self_engine over
                    tiny_self_models; target_engine: the tiny target alone (no draft)
offline_hub      -> an empty Hugging Face cache in tmp, offline (tests/helpers/hub.py)
tiny_ministral   -> a tiny ministral3 target on tiny_pair's tokenizer (tests/helpers/ministral.py)
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from edgespec.loading import paths
from edgespec.runtime import Engine
from tests.helpers.tiny import make_tiny_pair

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never touch the network
TESTS_HOME_MARK = ".edgespec-tests-home"


def _tests_home() -> None:
    """Point EDGESPEC_HOME at a home of the tests' own for the session, whose model folders are
    the real cache's (symlinks: what the tests load, pull or convert is kept as before), so that
    what else a run writes there stays out of the real cache: warm-ups save a calibration per
    pair named after its paths, and the tiny pairs live in pytest's temp folders, so every run
    left a few more files in ~/.cache/edgespec/calibration. Set once, by the first process (the
    xdist workers and the CLI subprocesses inherit it), and removed when that process ends."""
    real = paths.home()
    if (real / TESTS_HOME_MARK).exists():
        return
    mine = Path(tempfile.mkdtemp(prefix="edgespec-tests-home-"))
    (mine / TESTS_HOME_MARK).touch()
    for sub in ("models", "gguf", "converted", "locks"):
        (real / sub).mkdir(parents=True, exist_ok=True)
        (mine / sub).symlink_to(real / sub, target_is_directory=True)
    os.environ[paths.HOME_ENV] = str(mine)
    atexit.register(shutil.rmtree, mine, True)


_tests_home()

# Fixtures defined beside their helpers, shared with every test module without an import.
pytest_plugins = ["tests.helpers.hub", "tests.helpers.ministral"]


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups (its own hook, same name)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist's `--dist loadgroup` (the README's test command), a module whose tests
    name no group of their own runs on one worker, so that its module-scoped fixtures (a real
    model loaded, tiny models built) are made once rather than once on each worker."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_tiny_pair(tmp_path_factory.mktemp("tiny_pair"), seed=0, draft="subset")


@pytest.fixture(scope="session")
def tiny_self_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_tiny_pair(tmp_path_factory.mktemp("tiny_self_pair"), seed=0, draft="self")


def _loaded(path: Path, context_window: int = 512) -> SimpleNamespace:
    """A LoadedModel-like record (model, tokenizer, name, context_window) via mlx_lm.load."""
    from mlx_lm import load

    model, tokenizer = load(str(path))
    return SimpleNamespace(
        model=model, tokenizer=tokenizer, name=path.name, path=path, context_window=context_window
    )


@pytest.fixture(scope="session")
def tiny_models(tiny_pair) -> tuple[SimpleNamespace, SimpleNamespace]:
    """(target, draft) loaded once per session; build Engines from them (they hold no state)."""
    return _loaded(tiny_pair[0]), _loaded(tiny_pair[1])


@pytest.fixture(scope="session")
def tiny_self_models(tiny_self_pair) -> tuple[SimpleNamespace, SimpleNamespace]:
    return _loaded(tiny_self_pair[0]), _loaded(tiny_self_pair[1])


@pytest.fixture
def engine(tiny_models) -> Engine:
    """A fresh Engine over the tiny pair: empty caches (the models are shared, and stateless)."""
    return Engine(*tiny_models)


@pytest.fixture
def self_engine(tiny_self_models) -> Engine:
    """A fresh Engine whose draft is an exact copy of its target."""
    return Engine(*tiny_self_models)


@pytest.fixture
def target_engine(tiny_models) -> Engine:
    """A fresh Engine over the tiny target alone (n-gram drafting and plain decoding only)."""
    return Engine(tiny_models[0], None)
