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

import gettext
import gzip
import os
import random
import re
import shutil
import subprocess
import sysconfig
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from edgespec.distill.passages import (
    LONG_CHARS,
    MAX_CHARS,
    MIN_CHARS,
    Passage,
    clean,
    code_ok,
    debian_licence,
    group_paragraphs,
    is_texty,
    package_licence,
    paragraphs,
    python_pieces,
)

FOREIGN_LANGS = ("de", "fr", "es", "it", "nl", "pt", "pt_BR", "sv", "pl", "ru", "ja", "zh_CN")
_SKIP_STDLIB = {"test", "tests", "idlelib", "lib2to3", "site-packages", "__pycache__",
                "ensurepip", "turtledemo", "pydoc_data", "dist-packages"}  # fmt: skip
_HTML = re.compile(r"<[a-zA-Z/!][^>]*>")
_SKIP_SECTIONS = re.compile(
    r"^(NAME|SYNOPSIS|SEE ALSO|AUTHORS?|COPYRIGHT|REPORTING BUGS|BUGS|COLOPHON|HISTORY)$"
)


@dataclass(frozen=True)
class Caps:
    """How much to take from each collection (keeps any one package from dominating)."""

    per_file: int = 6  # passages per Python file
    package_files: int = 60  # .py files sampled per distribution
    per_package: int = 200  # passages per distribution
    man_per_package: int = 25  # English manual pages sampled per package
    foreign_pages: int = 60  # translated manual pages per language
    per_page: int = 4  # passages per manual page
    changelog_entries: int = 4  # newest entries per Debian changelog
    gettext_per_file: int = 12  # messages per .mo file


def _rng(seed: int, key: str) -> random.Random:
    return random.Random(f"{seed}:{key}")


def _sample(xs: list, k: int, rng: random.Random) -> list:
    return xs if len(xs) <= k else sorted(rng.sample(xs, k), key=xs.index)


def read_text(path: Path) -> str:
    """A text file, gunzipped if it ends in .gz; "" if unreadable or not UTF-8 text."""
    try:
        raw = gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()
        return raw.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
        return ""


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
    rng = _rng(seed, str(path))
    half = max(1, caps.per_file // 2)
    return _sample(docs, half, rng) + _sample(code, half, rng)


def stdlib_passages(caps: Caps, seed: int) -> Iterator[Passage]:
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if _SKIP_STDLIB & set(rel.parts[:-1]) or rel.name.startswith("test_"):
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
            meta["License-Expression"] or "", meta["License"] or "",
            [c for c in (meta.get_all("Classifier") or []) if c.startswith("License ::")],
        )  # fmt: skip
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
        f for f in (dist.files or [])
        if f.suffix == ".py" and not {"tests", "test", "testing"} & set(f.parts)
        and not f.name.startswith("test_")
    ]  # fmt: skip
    for f in _sample(sorted(files, key=str), caps.package_files, _rng(seed, source)):
        path = Path(dist.locate_file(f))
        module = ".".join(Path(f).with_suffix("").parts).removesuffix(".__init__")
        out.extend(python_file_passages(path, module, source, lic, caps, seed))
    return _sample(out, caps.per_package, _rng(seed, source + ":all"))


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


# ----------------------------------------------------------------------------- Debian


def dpkg_owners(info_dir: Path = Path("/var/lib/dpkg/info")) -> dict[str, str]:
    """Installed path -> package name, from dpkg's file lists."""
    owners: dict[str, str] = {}
    for lst in sorted(info_dir.glob("*.list")):
        pkg = lst.stem.split(":")[0]
        for line in read_text(lst).splitlines():
            owners.setdefault(line, pkg)
    return owners


def debian_licences(doc_dir: Path = Path("/usr/share/doc")) -> dict[str, str]:
    """Package -> the licence its copyright file names ("" unknown)."""
    out = {}
    for d in sorted(doc_dir.iterdir()) if doc_dir.is_dir() else []:
        out[d.name] = debian_licence(read_text(d / "copyright"))
    return out


def _owner_licence(path: Path, owners: dict[str, str], lic: dict[str, str]) -> tuple[str, str]:
    pkg = owners.get(str(path), "")
    return pkg, (lic.get(pkg) or "see the package's copyright file")


def man_passages(
    caps: Caps, seed: int, owners: dict[str, str], lic: dict[str, str]
) -> Iterator[Passage]:
    """Rendered manual pages: English ones as "reference", translated ones as "foreign"."""
    root = Path("/usr/share/man")
    if not root.is_dir() or shutil.which("man") is None:
        return
    by_pkg: dict[str, list[Path]] = {}
    for p in sorted(root.glob("man[1-8]/*")):
        if p.is_file():
            by_pkg.setdefault(owners.get(str(p), "?"), []).append(p)
    english = [
        p for pkg in sorted(by_pkg)
        for p in _sample(by_pkg[pkg], caps.man_per_package, _rng(seed, f"man:en:{pkg}"))
    ]  # fmt: skip
    groups = [("en", english)]
    for lang in FOREIGN_LANGS:
        pages = sorted(p for p in (root / lang).glob("man[1-8]/*") if p.is_file())
        groups.append(
            (lang.split("_")[0], _sample(pages, caps.foreign_pages, _rng(seed, f"man:{lang}")))
        )
    for lang, pages in groups:
        for page in pages:
            text = render_man(page)
            pkg, licence = _owner_licence(page, owners, lic)
            title = page.name.split(".")[0]
            chunks = list(man_chunks(text))
            for chunk in _sample(chunks, caps.per_page, _rng(seed, str(page))):
                form = "reference" if lang == "en" else "foreign"
                yield Passage(chunk, f"man:{lang}", f"{page} ({pkg})", licence, form, lang, title)


def render_man(page: Path) -> str:
    """A manual page as plain text (80 columns, no hyphenation or overstrike); "" on failure."""
    env = dict(os.environ, MANWIDTH="80", MAN_KEEP_FORMATTING="", LC_ALL="C.UTF-8")
    try:
        r = subprocess.run(
            ["man", "--nh", "--nj", "-l", str(page)], capture_output=True, env=env, timeout=20
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return re.sub(r".\x08", "", r.stdout.decode("utf-8", "replace"))


def man_chunks(rendered: str) -> Iterator[str]:
    """Body sections of a rendered page as passages: not the first (NAME, in any language), not
    SYNOPSIS, SEE ALSO, AUTHORS ...; short sections (a synopsis) give nothing anyway."""
    sections: list[tuple[str, list[str]]] = []
    for ln in rendered.splitlines()[1:-1]:  # drop the header and footer lines
        if ln and not ln[0].isspace() and ln.upper() == ln and any(c.isalpha() for c in ln):
            sections.append((ln.strip(), []))
        elif sections:
            sections[-1][1].append(ln)
    for head, body in sections[1:]:
        if not _SKIP_SECTIONS.match(head):
            yield from group_paragraphs([p for p in paragraphs("\n".join(body)) if is_texty(p)])


def info_passages(owners: dict[str, str], lic: dict[str, str], seed: int) -> Iterator[Passage]:
    for path in sorted(Path("/usr/share/info").glob("*.info*.gz")):
        text = read_text(path)
        pkg, licence = _owner_licence(path, owners, lic)
        if "GNU Free Documentation License" in text:
            licence = "GFDL-1.3+"
        paras = []
        for node in text.split("\x1f")[1:]:
            body = re.sub(r"^File: .*\n", "", node.strip())
            body = body.split("* Menu:")[0]
            paras += [p for p in paragraphs(body) if is_texty(p, 0.75) and not p.startswith("*")]
        chunks = list(group_paragraphs(paras))
        for c in _sample(chunks, 40, _rng(seed, str(path))):
            yield Passage(
                c, "gnu-info", f"{path} ({pkg})", licence, "prose", "en", path.name.split(".")[0]
            )


def debian_doc_passages(caps: Caps, seed: int, lic: dict[str, str]) -> Iterator[Passage]:
    """copyright files, changelog entries and READMEs under /usr/share/doc."""
    root = Path("/usr/share/doc")
    for d in sorted(root.iterdir()) if root.is_dir() else []:
        if d.is_symlink() or not d.is_dir():
            continue
        licence = lic.get(d.name) or "see the package's copyright file"
        cp = read_text(d / "copyright")
        for c in list(group_paragraphs(paragraphs(cp)))[:3]:
            yield Passage(
                c, "debian-copyright", str(d / "copyright"), licence, "legal", "en", d.name
            )
        for entry in changelog_entries(read_text(d / "changelog.Debian.gz"))[
            : caps.changelog_entries
        ]:
            if MIN_CHARS // 2 <= len(entry) <= MAX_CHARS:
                yield Passage(
                    entry,
                    "debian-changelog",
                    str(d / "changelog.Debian.gz"),
                    licence,
                    "changelog",
                    "en",
                    d.name,
                )
        for f in sorted(d.glob("*")):
            if _is_doc_file(f):
                paras = [p for p in paragraphs(read_text(f)) if is_texty(p, 0.7)]
                chunks = list(group_paragraphs([p for p in paras if not _HTML.search(p)]))
                for c in _sample(chunks, 4, _rng(seed, str(f))):
                    yield Passage(c, "debian-doc", str(f), licence, "prose", "en", d.name)


def _is_doc_file(f: Path) -> bool:
    """README / NEWS / FAQ / TODO as plain text (not HTML, PDF or images)."""
    plain = not re.search(r"\.(html?|pdf|png|svg|xml|css|js)(\.gz)?$", f.name, re.I)
    return bool(re.match(r"(README|NEWS|FAQ|TODO)", f.name, re.I)) and plain and f.is_file()


def changelog_entries(text: str) -> list[str]:
    """Entries of a Debian changelog, newest first ('pkg (version) dist; urgency=...' blocks).

    >>> changelog_entries("a (1.1) unstable; urgency=low\\n\\n  * x\\n\\n -- M <m@x>  Mon\\n\\na (1.0) x\\n")
    ['a (1.1) unstable; urgency=low\\n\\n  * x\\n\\n -- M <m@x>  Mon', 'a (1.0) x']
    """
    starts = [m.start() for m in re.finditer(r"^\S+ \([^)]+\)", text, re.M)]
    ends = starts[1:] + [len(text)]
    return [text[a:b].strip() for a, b in zip(starts, ends, strict=False)]


def licence_passages() -> Iterator[Passage]:
    for f in sorted(Path("/usr/share/common-licenses").glob("*")):
        if f.is_file() and not f.is_symlink():
            for c in group_paragraphs(paragraphs(read_text(f))):
                yield Passage(
                    c,
                    "common-licenses",
                    str(f),
                    f"{f.name} (licence text, verbatim copying permitted)",
                    "legal",
                    "en",
                    f.name,
                )


def dpkg_records(
    lic: dict[str, str], path: Path = Path("/var/lib/dpkg/status")
) -> Iterator[Passage]:
    """Package records (name, version, size, maintainer, description) as "record" passages."""
    keep = ("Package", "Version", "Architecture", "Installed-Size", "Maintainer", "Section",
            "Priority", "Depends", "Homepage", "Description")  # fmt: skip
    for stanza in read_text(path).split("\n\n"):
        fields = re.findall(r"^([A-Za-z-]+): (.*(?:\n .*)*)", stanza, re.M)
        rec = {k: v for k, v in fields if k in keep}
        if "Package" not in rec or "Description" not in rec or len(rec["Description"]) < 80:
            continue
        text = "\n".join(f"{k}: {rec[k]}" for k in keep if k in rec)
        pkg = rec["Package"]
        if len(text) <= LONG_CHARS:
            yield Passage(
                text,
                "dpkg-status",
                f"{path} ({pkg})",
                lic.get(pkg) or "see the package's copyright file",
                "record",
                "en",
                pkg,
            )


def gettext_passages(
    caps: Caps, seed: int, owners: dict[str, str], lic: dict[str, str]
) -> Iterator[Passage]:
    """Translated user messages (msgstr) of installed programs, one passage per message."""
    root = Path("/usr/share/locale")
    for lang in FOREIGN_LANGS:
        for mo in sorted((root / lang / "LC_MESSAGES").glob("*.mo")):
            try:
                with open(mo, "rb") as fh:
                    catalog = gettext.GNUTranslations(fh)._catalog  # type: ignore[attr-defined]
            except (OSError, UnicodeDecodeError, ValueError):
                continue
            msgs = sorted(
                {" ".join(str(v).split()) for k, v in catalog.items() if k and isinstance(v, str)}
            )
            msgs = [m for m in msgs if 60 <= len(m) <= 600 and is_texty(m, 0.75) and "%" not in m]
            pkg, licence = _owner_licence(mo, owners, lic)
            for m in _sample(msgs, caps.gettext_per_file, _rng(seed, str(mo))):
                yield Passage(
                    m,
                    f"gettext:{lang.split('_')[0]}",
                    f"{mo} ({pkg})",
                    licence,
                    "foreign",
                    lang.split("_")[0],
                    mo.stem,
                )


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
