"""Passages from what Debian installed on this machine: manual pages (English and translated),
GNU info manuals, /usr/share/doc READMEs, NEWS, changelogs and copyright files, the common
licence texts, dpkg's package records and translated program messages. Each passage carries the
licence of the package that installed its file."""

from __future__ import annotations

import gettext
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from research.distill.passages import (
    FOREIGN_LANGS,
    HTML_TAG,
    LONG_CHARS,
    MAX_CHARS,
    MIN_CHARS,
    SKIP_MAN_SECTIONS,
    Caps,
    Passage,
    debian_licence,
    group_paragraphs,
    is_texty,
    paragraphs,
    read_text,
    sample_in_order,
    seeded_rng,
)


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
        p
        for pkg in sorted(by_pkg)
        for p in sample_in_order(
            by_pkg[pkg], caps.man_per_package, seeded_rng(seed, f"man:en:{pkg}")
        )
    ]
    groups = [("en", english)]
    for lang in FOREIGN_LANGS:
        pages = sorted(p for p in (root / lang).glob("man[1-8]/*") if p.is_file())
        groups.append(
            (
                lang.split("_")[0],
                sample_in_order(pages, caps.foreign_pages, seeded_rng(seed, f"man:{lang}")),
            )
        )
    for lang, pages in groups:
        for page in pages:
            text = render_man(page)
            pkg, licence = _owner_licence(page, owners, lic)
            title = page.name.split(".")[0]
            chunks = list(man_chunks(text))
            for chunk in sample_in_order(chunks, caps.per_page, seeded_rng(seed, str(page))):
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
        if not SKIP_MAN_SECTIONS.match(head):
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
        for c in sample_in_order(chunks, 40, seeded_rng(seed, str(path))):
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
                chunks = list(group_paragraphs([p for p in paras if not HTML_TAG.search(p)]))
                for c in sample_in_order(chunks, 4, seeded_rng(seed, str(f))):
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
    keep = (
        "Package",
        "Version",
        "Architecture",
        "Installed-Size",
        "Maintainer",
        "Section",
        "Priority",
        "Depends",
        "Homepage",
        "Description",
    )
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
            for m in sample_in_order(msgs, caps.gettext_per_file, seeded_rng(seed, str(mo))):
                yield Passage(
                    m,
                    f"gettext:{lang.split('_')[0]}",
                    f"{mo} ({pkg})",
                    licence,
                    "foreign",
                    lang.split("_")[0],
                    mo.stem,
                )
