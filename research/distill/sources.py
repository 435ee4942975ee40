"""Find real text on this machine and cut it into `Passage`s, each with its origin and licence.

Collections (each skipped quietly when absent; `collect` reports what each one gave):
  python-stdlib      docstrings and functions of the standard library's own .py files (PSF-2.0)
  pypi:NAME          docstrings, functions and the README of installed distributions, with the
                     licence from their metadata (proprietary or unknown licences are left out)
  man:LANG           manual pages rendered by `man -l` (English and translated pages)
  gnu-info           GNU manuals in /usr/share/info
  debian-copyright   /usr/share/doc/*/copyright
  debian-changelog   /usr/share/doc/*/changelog.Debian.gz entries
  debian-doc         READMEs and NEWS files in /usr/share/doc
  common-licenses    licence texts in /usr/share/common-licenses
  dpkg-status        package records from /var/lib/dpkg/status
  gettext:LANG       translated messages of installed programs (/usr/share/locale)
Debian files carry the licence of the package that installed them (its copyright file).

Deterministic for a seed on a given machine (sorted listings, per-file seeded sampling); a
different machine has other files, so a built prompt pool is saved and reused, never rebuilt
under a running data job (see pool.py).
"""

from __future__ import annotations

import re
import sysconfig
from collections.abc import Iterable, Iterator
from pathlib import Path

from research.distill.debian import (
    debian_doc_passages,
    debian_licences,
    dpkg_owners,
    dpkg_records,
    gettext_passages,
    info_passages,
    licence_passages,
    man_passages,
)
from research.distill.passages import (
    MAX_CHARS,
    MIN_CHARS,
    SKIP_STDLIB,
    Caps,
    Passage,
    clean,
    code_ok,
    group_paragraphs,
    is_texty,
    package_licence,
    paragraphs,
    python_pieces,
    read_text,
    sample_in_order,
    seeded_rng,
)

# ----------------------------------------------------------------------------- Python


def python_file_passages(
    path: Path, module: str, source: str, licence: str, caps: Caps, seed: int
) -> list[Passage]:
    """Docstring and code passages of one .py file: at most caps.per_file // 2 of each (seeded)."""
    docs, code = [], []
    for piece in python_pieces(read_text(path), module):
        text = clean(piece.text) if piece.kind != "code" else piece.text.rstrip()
        title = f"{module}.{piece.signature}" if piece.kind != "module-doc" else module
        origin = f"{path}:{piece.name}"
        if piece.kind == "code" and code_ok(text):
            code.append(Passage(text, source, origin, licence, "code", "en", title))
        elif piece.kind != "code" and int(MIN_CHARS * 0.7) <= len(text) <= MAX_CHARS:
            if is_texty(text, 0.7):
                docs.append(Passage(text, source, origin, licence, "docstring", "en", title))
    rng = seeded_rng(seed, str(path))
    half = max(1, caps.per_file // 2)
    return sample_in_order(docs, half, rng) + sample_in_order(code, half, rng)


def stdlib_passages(caps: Caps, seed: int) -> Iterator[Passage]:
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if SKIP_STDLIB & set(rel.parts[:-1]) or rel.name.startswith("test_"):
            continue
        module = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
        yield from python_file_passages(path, module, "python-stdlib", "PSF-2.0", caps, seed)


def package_passages(
    caps: Caps, seed: int, exclude: tuple[str, ...] = ("edgespec",)
) -> Iterator[Passage]:
    """Installed distributions with a known, non-proprietary licence."""
    from importlib.metadata import distributions

    seen: set[str] = set()
    for dist in sorted(distributions(), key=lambda d: (d.metadata["Name"] or "").lower()):
        name = (dist.metadata["Name"] or "").lower()
        if not name or name in seen or name in exclude:
            continue
        seen.add(name)
        meta = dist.metadata
        lic = package_licence(
            meta["License-Expression"] or "",
            meta["License"] or "",
            [c for c in (meta.get_all("Classifier") or []) if c.startswith("License ::")],
        )
        if not lic:
            continue
        yield from _distribution_passages(dist, name, lic, caps, seed)


def _distribution_passages(dist, name: str, lic: str, caps: Caps, seed: int) -> list[Passage]:  # type: ignore[no-untyped-def]
    source = f"pypi:{name}"
    out = [
        Passage(t, source, f"{name} (package description)", lic, "prose", "en", name)
        for t in group_paragraphs(_readme_paragraphs(dist.metadata.get_payload() or ""))
    ]
    files = [
        f
        for f in (dist.files or [])
        if f.suffix == ".py"
        and not {"tests", "test", "testing"} & set(f.parts)
        and not f.name.startswith("test_")
    ]
    for f in sample_in_order(sorted(files, key=str), caps.package_files, seeded_rng(seed, source)):
        path = Path(dist.locate_file(f))
        module = ".".join(Path(f).with_suffix("").parts).removesuffix(".__init__")
        out.extend(python_file_passages(path, module, source, lic, caps, seed))
    return sample_in_order(out, caps.per_package, seeded_rng(seed, source + ":all"))


def _readme_paragraphs(text: str) -> list[str]:
    """Prose paragraphs of a Markdown/reST README: no badges, images, HTML, tables or code."""
    keep = []
    for p in paragraphs(re.sub(r"```.*?```", "", text, flags=re.S)):
        if re.search(r"<[a-z/!]|\]\(|^\.\. |^\||^[=\-~#*`]{3,}|image::", p) or not is_texty(
            p, 0.75
        ):
            continue
        keep.append(p.lstrip("#* "))
    return keep


# ----------------------------------------------------------------------------- all


def collect(seed: int = 0, caps: Caps | None = None, *, man: bool = True) -> list[Passage]:
    """Every collection, in a fixed order, without duplicate texts."""
    caps = caps or Caps()
    owners, lic = dpkg_owners(), debian_licences()
    parts: list[Iterator[Passage]] = [
        stdlib_passages(caps, seed),
        package_passages(caps, seed),
        info_passages(owners, lic, seed),
        debian_doc_passages(caps, seed, lic),
        licence_passages(),
        dpkg_records(lic),
        gettext_passages(caps, seed, owners, lic),
    ]
    if man:
        parts.append(man_passages(caps, seed, owners, lic))
    return unique(parts)


def unique(parts: Iterable[Iterable[Passage]]) -> list[Passage]:
    """The passages of every part in order, each text once (licence boilerplate repeats a lot)."""
    seen: set[str] = set()
    out = []
    for part in parts:
        for p in part:
            if p.text not in seen:
                seen.add(p.text)
                out.append(p)
    return out
