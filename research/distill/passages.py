"""Real text for training prompts: the `Passage` record and the pure helpers that cut text into
passages (paragraph grouping, Python docstrings and function bodies, licence names).

Nothing here reads the machine; `sources.py` finds the files and calls these helpers. A passage is
short on purpose (about 80-400 tokens, `MIN_CHARS`..`MAX_CHARS` characters) so that the target's
answers stay affordable on a CPU.
"""

from __future__ import annotations

import ast
import gzip
import random
import re
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MIN_CHARS = 300  # ~80 tokens of English
MAX_CHARS = 1600  # ~400 tokens
LONG_CHARS = 2600  # the occasional long context (summaries, multi-document questions)

# Forms a passage can take; tasks pick passages by form.
FORMS = ("prose", "docstring", "code", "reference", "legal", "changelog", "record", "foreign")


@dataclass(frozen=True)
class Passage:
    """One piece of real text and where it came from.

    source: the collection (e.g. "python-stdlib", "pypi:numpy", "man:de", "debian-copyright");
    origin: the file (and the object inside it) the text was cut from; licence: the licence the
    text is distributed under (SPDX-like when known); form: one of FORMS; lang: ISO 639-1 code;
    title: what the text is about (a module, function, command or package name).
    """

    text: str
    source: str
    origin: str
    licence: str
    form: str
    lang: str = "en"
    title: str = ""


def clean(text: str) -> str:
    """Normalise whitespace inside lines, drop trailing spaces and runs of blank lines.

    >>> clean("a  b \\n\\n\\n\\nc\\t d")
    'a b\\n\\nc d'
    """
    lines = [re.sub(r"[ \t]+", " ", ln).rstrip() for ln in text.replace("\r", "").split("\n")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def is_texty(text: str, min_letters: float = 0.6) -> bool:
    """Mostly letters and spaces (not a table of numbers, a hex dump or ASCII art).

    >>> is_texty("The quick brown fox."), is_texty("0x1f 0x2e | 33 | 44 | ---")
    (True, False)
    """
    if not text or any(ord(c) < 32 and c not in "\n\t" for c in text):
        return False
    ok = sum(c.isalpha() or c.isspace() for c in text)
    return ok / len(text) >= min_letters


def paragraphs(text: str) -> list[str]:
    """Blank-line separated blocks, each with its wrapped lines joined (indentation dropped).

    >>> paragraphs("one\\n  two\\n\\nthree")
    ['one two', 'three']
    """
    out = []
    for block in re.split(r"\n\s*\n", text):
        joined = " ".join(ln.strip() for ln in block.strip().splitlines() if ln.strip())
        if joined:
            out.append(joined)
    return out


def group_paragraphs(paras: list[str], lo: int = MIN_CHARS, hi: int = MAX_CHARS) -> Iterator[str]:
    """Consecutive paragraphs joined (blank line between) into chunks of lo..hi characters.

    A paragraph longer than `hi` is cut at sentence ends; chunks shorter than `lo` are dropped.

    >>> [len(c) for c in group_paragraphs(["a" * 200, "b" * 200, "c" * 250], lo=300, hi=500)]
    [402]
    """
    cur: list[str] = []
    size = 0
    for p in _split_long(paras, hi):
        if cur and size + len(p) + 2 > hi:
            if size >= lo:
                yield "\n\n".join(cur)
            cur, size = [], 0
        cur.append(p)
        size += len(p) + (2 if size else 0)
    if cur and size >= lo:
        yield "\n\n".join(cur)


def _split_long(paras: list[str], hi: int) -> Iterator[str]:
    """Paragraphs longer than `hi` cut at sentence ends (a sentence longer than `hi` at spaces)."""
    for p in paras:
        if len(p) <= hi:
            yield p
            continue
        piece = ""
        for sent in re.split(r"(?<=[.!?])\s+", p):
            while len(sent) > hi:
                cut = sent.rfind(" ", 0, hi)
                cut = cut if cut > hi // 2 else hi
                yield from ([piece] if piece else [])
                piece = ""
                yield sent[:cut].strip()
                sent = sent[cut:].strip()
            if piece and len(piece) + len(sent) + 1 > hi:
                yield piece
                piece = ""
            piece = f"{piece} {sent}".strip()
        if piece:
            yield piece


def sentences(text: str) -> list[str]:
    """Rough sentence split (on . ! ? followed by space and a capital or a digit).

    >>> sentences("Ein Satz. Noch einer! Und 3 mehr.")
    ['Ein Satz.', 'Noch einer!', 'Und 3 mehr.']
    """
    parts = re.split(r"(?<=[.!?])\s+(?=[A-ZÄÖÜÉÈÀ0-9\"„«¿¡])", " ".join(text.split()))
    return [p.strip() for p in parts if p.strip()]


# ----------------------------------------------------------------------------- Python source


@dataclass(frozen=True)
class PyPiece:
    """A docstring or a function body cut from a Python file; `name` is dotted (Class.method),
    `signature` is `name(args)` for functions and `name` otherwise."""

    kind: str  # "module-doc" | "doc" | "code"
    name: str
    signature: str
    text: str


def python_pieces(source: str, module: str) -> list[PyPiece]:
    """Docstrings (module, classes, functions) and whole function definitions of one file.

    >>> src = "def add(a, b):\\n    'Add two numbers.'\\n    return a + b\\n"
    >>> [(p.kind, p.signature) for p in python_pieces(src, "m")]
    [('doc', 'add(a, b)'), ('code', 'add(a, b)')]
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    lines = source.splitlines()
    out = []
    doc = ast.get_docstring(tree)
    if doc:
        out.append(PyPiece("module-doc", module, module, doc))
    for node, qual in _defs(tree, ""):
        is_fn = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        sig = qual
        if is_fn:
            try:
                sig = f"{qual}({ast.unparse(node.args)})"  # type: ignore[attr-defined]
            except (ValueError, RecursionError):
                pass
        d = ast.get_docstring(node)  # type: ignore[arg-type]
        if d:
            out.append(PyPiece("doc", qual, sig, d))
        if is_fn:
            first = min([node.lineno] + [x.lineno for x in node.decorator_list])  # type: ignore[attr-defined]
            seg = "\n".join(lines[first - 1 : node.end_lineno])  # type: ignore[attr-defined]
            out.append(PyPiece("code", qual, sig, textwrap.dedent(seg)))
    return out


def _defs(tree: ast.AST, prefix: str) -> Iterator[tuple[ast.AST, str]]:
    for node in getattr(tree, "body", []):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            qual = f"{prefix}{node.name}"
            yield node, qual
            if isinstance(node, ast.ClassDef):
                yield from _defs(node, qual + ".")


def code_ok(text: str, lo: int = 200, hi: int = MAX_CHARS) -> bool:
    """A function worth asking about: lo..hi characters, 5..45 lines, not only a docstring."""
    lines = text.strip().splitlines()
    return lo <= len(text) <= hi and 5 <= len(lines) <= 45


# ----------------------------------------------------------------------------- licences

_CLASSIFIERS = {
    "MIT License": "MIT",
    "BSD License": "BSD",
    "Apache Software License": "Apache-2.0",
    "Mozilla Public License 2.0 (MPL 2.0)": "MPL-2.0",
    "ISC License (ISCL)": "ISC",
    "Python Software Foundation License": "PSF-2.0",
    "Public Domain": "public-domain",
    "GNU General Public License v2 (GPLv2)": "GPL-2.0",
    "GNU General Public License v3 (GPLv3)": "GPL-3.0",
    "GNU Lesser General Public License v3 (LGPLv3)": "LGPL-3.0",
}
_SHORT = re.compile(r"^[A-Za-z0-9.\-+ ()]{2,40}$")


def package_licence(expression: str, licence: str, classifiers: list[str]) -> str:
    """A Python distribution's licence from its metadata: License-Expression, else the trove
    classifiers, else a short License field; "" when unknown or proprietary.

    >>> package_licence("", "", ["License :: OSI Approved :: MIT License"])
    'MIT'
    >>> package_licence("", "Intel End User License", ["License :: Other/Proprietary License"])
    ''
    """
    if any("Proprietary" in c for c in classifiers):
        return ""
    if expression.strip():
        return expression.strip()
    names = [_CLASSIFIERS.get(c.split("::")[-1].strip(), "") for c in classifiers]
    names = [n for n in names if n]
    if names:
        return " OR ".join(dict.fromkeys(names))
    first = licence.strip().splitlines()[0] if licence.strip() else ""
    if first and first.upper() != "UNKNOWN" and _SHORT.match(first):
        return first
    return ""


# A DEP-5 licence field: "License: GPL-2+", "License: BSD-3-clause or GPL-2", on one line.
_DEP5 = re.compile(
    r"^License:[ \t]*([A-Za-z0-9][\w.+-]*(?:[ \t]+(?:or|and|with)[ \t]+[\w.+ -]+)?)[ \t]*$", re.M
)
_KNOWN = (
    ("GPL-3", r"GNU General Public License.{0,40}version 3|GPL-?3"),
    ("GPL-2", r"GNU General Public License.{0,40}version 2|GPL-?2"),
    ("LGPL", r"Lesser General Public License|LGPL"),
    ("GFDL", r"GNU Free Documentation License|GFDL"),
    ("Apache-2.0", r"Apache License,? Version 2"),
    ("Expat", r"Expat|MIT License|Permission is hereby granted, free of charge"),
    ("BSD", r"BSD|Redistribution and use in source and binary forms"),
    ("Artistic", r"Artistic License"),
    ("public-domain", r"public domain"),
)


def debian_licence(copyright_text: str) -> str:
    """The main licence named by a Debian copyright file: DEP-5's License: field of the
    `Files: *` stanza (else the first short License: field), else the first well-known licence
    mentioned; "" when none is recognisable.

    >>> debian_licence("Format: ...\\n\\nFiles: debian/*\\nLicense: GPL-2+\\n\\nFiles: *\\nLicense: MIT\\n")
    'MIT'
    >>> debian_licence("License:\\n Different licenses apply to different files.\\n") == ""
    True
    """
    for stanza in re.split(r"\n\s*\n", copyright_text):
        if re.match(r"Files:[ \t]*\*[ \t]*$", stanza.strip(), re.M):
            m = _DEP5.search(stanza)
            if m:
                return m.group(1).strip()
    m = _DEP5.search(copyright_text)
    if m:
        return m.group(1).strip()
    for name, pattern in _KNOWN:
        if re.search(pattern, copyright_text, re.I | re.S):
            return name
    return ""


# ----------------------------------------------------------------------------- collecting

FOREIGN_LANGS = ("de", "fr", "es", "it", "nl", "pt", "pt_BR", "sv", "pl", "ru", "ja", "zh_CN")
SKIP_STDLIB = {
    "test",
    "tests",
    "idlelib",
    "lib2to3",
    "site-packages",
    "__pycache__",
    "ensurepip",
    "turtledemo",
    "pydoc_data",
    "dist-packages",
}
HTML_TAG = re.compile(r"<[a-zA-Z/!][^>]*>")
SKIP_MAN_SECTIONS = re.compile(
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


def seeded_rng(seed: int, key: str) -> random.Random:
    return random.Random(f"{seed}:{key}")


def sample_in_order(xs: list, k: int, rng: random.Random) -> list:
    return xs if len(xs) <= k else sorted(rng.sample(xs, k), key=xs.index)


def read_text(path: Path) -> str:
    """A text file, gunzipped if it ends in .gz; "" if unreadable or not UTF-8 text."""
    try:
        raw = gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()
        return raw.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
        return ""
