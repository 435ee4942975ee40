"""Long prompts for `edgespec bench --context 1k,4k,8k`: real text the project owns, cut to a
token length at a sensible boundary, with the instruction at the end.

Three kinds, each a task a user brings to a long context:
- doc: the project's own documentation (a snapshot shipped in edgespec/data/context/, since
  docs/ is not installed) to summarize and answer questions from, cut at a paragraph;
- code: the installed package's own Python source to explain and change, cut at a top-level
  block (a def, a class, a run of statements);
- chat: a multi-turn conversation built from the same documentation, one section per assistant
  turn, through the tokenizer's chat template, cut at a whole turn.
`--context-file PATH` replaces them with the user's text (one `file` kind, cut at a paragraph).

Lengths are in units of 1000 tokens ("8k" = 8000), so an 8k prompt plus its answer fits a model
whose window is 8192. Nothing here loads a model: the tokenizer comes in as `encode_chat`.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgespec.errors import ConfigError, PromptError

DATA = Path(__file__).resolve().parents[1] / "data" / "context"
PACKAGE = Path(__file__).resolve().parents[1]
KINDS = ("doc", "code", "chat")
FILE_KIND = "file"

DOC_TASK = (
    "Summarize the document above in five bullet points, then answer: which settings does it "
    "say change the speed of decoding, and why?"
)
CODE_TASK = (
    "Explain what the code above does, module by module, then propose one change that would "
    "make the longest function simpler, as a unified diff."
)
CHAT_TASK = "Summarize our conversation so far in five bullet points, then say what to read next."
FILE_TASK = (
    "Summarize the text above in five bullet points, then list the questions it leaves open."
)

Encode = Callable[[list[dict[str, str]]], list[int]]


@dataclass(frozen=True)
class ContextPrompt:
    """One long prompt: `kind` cut to at most `length` tokens; `ids` the chat-encoded prompt."""

    kind: str
    length: int  # the requested length in tokens
    ids: tuple[int, ...]

    @property
    def id(self) -> str:
        return f"{self.kind}@{label(self.length)}"


def label(tokens: int) -> str:
    """'8k' for 8000, '1.5k' for 1500, '300' for 300."""
    return f"{tokens / 1000:g}k" if tokens >= 1000 else str(tokens)


def parse_lengths(text: str) -> tuple[int, ...]:
    """'1k,4k,8k' -> (1000, 4000, 8000); plain counts pass as they are ('512' -> 512)."""
    out = []
    for item in (x.strip().lower() for x in text.split(",")):
        if not item:
            continue
        match = re.fullmatch(r"(\d+(?:\.\d+)?)(k?)", item)
        if match is None:
            raise ConfigError(f"--context takes token counts such as 1k,4k,8k or 512, not {item!r}")
        n = int(float(match[1]) * (1000 if match[2] else 1))
        if n < 64:
            raise ConfigError(f"--context lengths must be at least 64 tokens, got {item!r}")
        out.append(n)
    if not out:
        raise ConfigError("--context needs at least one length, e.g. 1k,4k,8k")
    return tuple(dict.fromkeys(out))


def check_window(lengths: Sequence[int], max_tokens: int, window: int | None, name: str) -> None:
    """ConfigError when the longest context plus its answer does not fit `window` tokens."""
    if window is None:
        return
    longest = max(lengths)
    if longest + max_tokens > window:
        raise ConfigError(
            f"--context {label(longest)} needs {longest} + {max_tokens} new tokens, beyond the "
            f"context window of {name} ({window} tokens)"
        )


def read_context_file(path: str | Path) -> str:
    """The user's text, or a one-line PromptError: missing, not a file, empty, not UTF-8 text."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise PromptError(f"--context-file {path}: no such file")
    try:
        data = p.read_bytes()
        text = data.decode("utf-8")
    except OSError as exc:
        raise PromptError(f"--context-file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise PromptError(f"--context-file {path}: not UTF-8 text") from None
    if "\x00" in text:
        raise PromptError(f"--context-file {path}: not text (it holds NUL bytes)")
    if not text.strip():
        raise PromptError(f"--context-file {path}: the file is empty")
    return text


def doc_paragraphs() -> list[str]:
    """The shipped documentation, paragraph by paragraph, in a fixed order."""
    out: list[str] = []
    for path in sorted(DATA.glob("*.md")):
        out += paragraphs(path.read_text(encoding="utf-8"))
    return out


def paragraphs(text: str) -> list[str]:
    """Blank-line-separated blocks, stripped, empty ones dropped."""
    return [b.strip() for b in re.split(r"\n\s*\n", text) if b.strip()]


def code_blocks() -> list[str]:
    """The package's own Python source, file by file (sorted), split at top-level blocks: each
    block starts at a line with no indentation after a blank line, so a def or class stays whole."""
    out: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        blocks = re.split(r"\n\s*\n(?=\S)", path.read_text(encoding="utf-8"))
        blocks = [b.rstrip() for b in blocks if b.strip()]
        if blocks:
            out.append(f"# file: {rel}\n{blocks[0]}")
            out += blocks[1:]
    return out


def chat_sections(turn_chars: int = 1200) -> list[tuple[str, str]]:
    """(heading, answer) per exchange of the chat kind: each '##' / '###' section of the shipped
    documentation, its paragraphs grouped into answers of about `turn_chars` characters (so a
    context can be cut at a whole exchange of a few hundred tokens), in a fixed order."""
    out: list[tuple[str, str]] = []
    for path in sorted(DATA.glob("*.md")):
        for part in re.split(r"\n(?=#{2,3} )", path.read_text(encoding="utf-8")):
            head, _, body = part.partition("\n")
            if not head.startswith("#"):
                continue
            answer: list[str] = []
            units = paragraphs(body)
            if turn_chars < 200:  # short turns: whole lines, not paragraphs
                units = [line for u in units for line in u.split("\n")]
            for para in units:
                answer.append(para)
                if sum(len(a) for a in answer) >= turn_chars:
                    out.append((head.lstrip("# ").strip(), "\n\n".join(answer)))
                    answer = []
            if answer:
                out.append((head.lstrip("# ").strip(), "\n\n".join(answer)))
    return out


# A token is rarely longer than this many characters: the bisection over pieces starts below
# the piece where the text reaches it, so that nothing far longer than the context is encoded.
MAX_CHARS_PER_TOKEN = 12


def _longest_fit(
    pieces: Sequence[str], build: Callable[[int], list[int]], length: int
) -> list[int] | None:
    """build(i) for the largest i in 1..len(pieces) whose encoding holds at most `length`
    tokens (the count grows with i), by bisection; None when even one piece is too long."""
    chars, hi = 0, len(pieces)
    for i, piece in enumerate(pieces, 1):
        chars += len(piece) + 2
        if chars > length * MAX_CHARS_PER_TOKEN:
            hi = i
            break
    lo, best = 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        ids = build(mid)
        if len(ids) <= length:
            best, lo = ids, mid + 1
        else:
            hi = mid - 1
    return best


def _blocks_prompt(
    blocks: list[str], task: str, length: int, encode: Encode, joiner: str = "\n\n"
) -> list[int]:
    """The longest run of whole blocks, then the task, that fits `length` tokens; where whole
    blocks fall short of 90% of it (one long block next), the same cut at a whole line."""
    best: list[int] = []
    for pieces, glue in ((blocks, joiner), (_lines(blocks, joiner), "\n")):

        def build(i: int, pieces: Sequence[str] = pieces, glue: str = glue) -> list[int]:
            return encode([{"role": "user", "content": glue.join(pieces[:i]) + "\n\n" + task}])

        ids = _longest_fit(pieces, build, length) or []
        best = max(best, ids, key=len)
        if len(best) >= length * 0.9:
            return best
    if not best:
        raise PromptError(f"no {label(length)}-token prompt can be cut from this text")
    if _fits_whole(blocks, length):
        raise PromptError(
            f"the text holds about {len(best)} tokens, too few for a {label(length)}-token context"
        )
    return best


def _fits_whole(pieces: Sequence[str], length: int) -> bool:
    """Whether the bisection could take every piece (the text ran out before the context)."""
    return sum(len(p) + 2 for p in pieces) <= length * MAX_CHARS_PER_TOKEN


def _lines(blocks: list[str], joiner: str) -> list[str]:
    """The blocks' lines, a blank line (the joiner's) between blocks."""
    out: list[str] = []
    for b in blocks:
        if out:
            out += [""] * (joiner.count("\n") - 1)
        out += b.split("\n")
    return out


def _chat_prompt(length: int, encode: Encode) -> list[int]:
    ask = {"role": "user", "content": CHAT_TASK}
    for turn_chars in (1200, 300, 80):  # shorter answers where a tokenizer spends many tokens
        sections = chat_sections(turn_chars)
        turns: list[dict[str, str]] = []
        part = 0
        for j, (heading, body) in enumerate(sections):
            part = part + 1 if j and sections[j - 1][0] == heading else 1
            ask_part = (
                f"What does the documentation say about {heading}?"
                if part == 1
                else f"Go on about {heading} (part {part})."
            )
            turns += [
                {"role": "user", "content": ask_part},
                {"role": "assistant", "content": body},
            ]
        newest = [f"{h}\n{b}" for h, b in reversed(sections)]  # the bisection's pieces

        def build(i: int, turns: list[dict[str, str]] = turns) -> list[int]:
            return encode(turns[len(turns) - 2 * i :] + [ask])  # the newest i exchanges

        ids = _longest_fit(newest, build, length)
        if ids is not None:
            return ids
    raise PromptError(f"no {label(length)}-token conversation can be cut from the documentation")


def build_prompts(
    kinds: Sequence[str], lengths: Sequence[int], encode: Encode, file_text: str | None = None
) -> list[ContextPrompt]:
    """One prompt per (length, kind), lengths in the order given; `file_text` replaces the kinds
    with the user's text."""
    if file_text is not None:
        kinds = (FILE_KIND,)
    _quiet_tokenizer()
    out = []
    docs = doc_paragraphs() if "doc" in kinds else []
    code = code_blocks() if "code" in kinds else []
    for length in lengths:
        for kind in kinds:
            if kind == FILE_KIND:
                ids = _blocks_prompt(paragraphs(file_text or ""), FILE_TASK, length, encode)
            elif kind == "doc":
                ids = _blocks_prompt(docs, DOC_TASK, length, encode)
            elif kind == "code":
                ids = _blocks_prompt(code, CODE_TASK, length, encode, joiner="\n\n\n")
            else:
                ids = _chat_prompt(length, encode)
            out.append(ContextPrompt(kind, length, tuple(ids)))
    return out


def _quiet_tokenizer() -> None:
    """Encoding a text longer than the tokenizer's model_max_length only warns (the bench cuts
    it, or refuses it in one line): quiet that warning."""
    logging.getLogger("transformers.tokenization_utils_base").setLevel(logging.ERROR)


def parse_kinds(text: str) -> tuple[str, ...]:
    """'doc,code' -> ('doc', 'code'); ConfigError for a kind not in KINDS."""
    kinds = tuple(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise ConfigError(f"--context-kinds takes {', '.join(KINDS)}, not {text!r}")
    return kinds


def known_window(target: str | None, draft: str | None, pair: str | None) -> tuple[int, str] | None:
    """(context window, model name) of the pair from config.json files already on disk, read
    before anything loads (the smaller of target's and draft's); None where a config is not on
    disk yet (a model still to download: the window is then checked once it has loaded)."""
    from edgespec.config import MTP_DRAFT
    from edgespec.loading.paths import model_dir
    from edgespec.loading.specs import load_catalog, pair_specs, spec_kind

    cat = load_catalog()
    target_spec, draft_spec, _ = pair_specs(target, draft, pair, cat)
    found: list[tuple[int, str]] = []
    for spec in (target_spec, draft_spec):
        if spec is None or spec == MTP_DRAFT:
            continue
        kind = spec_kind(spec, cat)
        folder: Path | None = None
        if kind == "folder":
            folder = Path(spec).expanduser()
        elif kind == "catalogue":
            entry = cat.model(spec)
            folder = entry.local or model_dir(spec)
        config = folder / "config.json" if folder is not None else None
        if config is None or not config.is_file():
            return None if spec == target_spec else found[0]
        try:
            raw = json.loads(config.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        # as loading.folder.context_window reads it, without importing mlx-lm (that module does)
        window = raw.get("max_position_embeddings") or raw.get("text_config", {}).get(
            "max_position_embeddings"
        )
        if not window:
            return None  # the loader's default applies: checked once the models load
        found.append((int(window), spec))
    return min(found, key=lambda f: f[0]) if found else None


@dataclass(frozen=True)
class ContextRequest:
    """The long-context mode as the command line asks for it: lengths (None: the file whole),
    prompt kinds, and the user's text."""

    lengths: tuple[int, ...] | None
    kinds: tuple[str, ...]
    file_text: str | None
    file: str | None


def context_request(args: argparse.Namespace) -> ContextRequest | None:
    """None outside the long-context mode; else the request, checked before anything loads:
    lengths and kinds parsed, the file read, and the longest context plus its answer checked
    against the pair's context window where its config is on disk."""
    from edgespec.loading.specs import check_pair

    if args.context is None and args.context_file is None:
        return None
    if args.cold:
        raise ConfigError("--cold measures first answers of short prompts; drop --context")
    if args.prompts or args.categories or args.limit is not None:
        raise ConfigError(
            "--context uses its own long prompts: drop --prompts/--categories/--limit"
        )
    lengths = parse_lengths(args.context) if args.context is not None else None
    kinds = parse_kinds(args.context_kinds)
    text = read_context_file(args.context_file) if args.context_file else None
    if lengths is not None:
        check_pair(args.target, args.draft, args.pair)
        window = known_window(args.target, args.draft, args.pair)
        if window is not None:
            check_window(lengths, args.max_tokens, window[0], window[1])
    return ContextRequest(lengths, kinds, text, args.context_file)


def engine_prompts(engine: Any, request: ContextRequest, max_tokens: int) -> list:
    """The long prompts, built with the loaded tokenizer; a context that does not fit the window
    with its answer (a pair whose config was not on disk before loading, or a file used whole)
    is refused here, before any prefill."""
    _quiet_tokenizer()
    if request.lengths is None:  # the file whole
        text = request.file_text or ""
        ids = engine.encode_chat([{"role": "user", "content": text + "\n\n" + FILE_TASK}])
        if len(ids) + max_tokens > engine.context_window:
            raise ConfigError(
                f"--context-file {request.file} is {len(ids)} tokens with its instruction; with "
                f"{max_tokens} new tokens that is beyond the context window of {engine.name} "
                f"({engine.context_window} tokens): pass --context to cut it"
            )
        lengths: tuple[int, ...] = (len(ids),)
    else:
        lengths = request.lengths
    check_window(lengths, max_tokens, engine.context_window, engine.name)
    return build_prompts(request.kinds, lengths, engine.encode_chat, request.file_text)
