"""OpenAI request bodies -> validated requests (GenerationConfig, stop strings, stream flags).

Pure Python (no HTTP framework, no MLX), so every rule is unit-tested directly. A bad field
raises RequestError with an OpenAI-style status, one-line message and the field's name:

    parse_chat({"messages": [{"role": "user", "content": "Hi"}], "temperature": -1}, defaults)
    -> RequestError(400, "temperature must be between 0 and 2 (as in the OpenAI API), got -1",
                    param="temperature")

Fields honoured: model, messages / prompt, max_tokens / max_completion_tokens, temperature, top_p,
top_k, min_p, seed, stop, n (1 only), stream, stream_options.include_usage, and the extension
object `edgespec` {k, method, adaptive, k_max} (validated like the CLI's -k / --method /
--adaptive / --k-max; a method the served pair cannot run is refused here). Prompts are text:
special-token strings in messages and in a completions prompt are characters, never control
tokens (edgespec/prompting.py), unless a completions request sets `edgespec.parse_special: true`.
`chat_template_kwargs: {"enable_thinking": bool}` (chat, as vLLM and SGLang take it) sets the
template's thinking mode where it has one; other keys: refused. Fields that would change the
answer and are not implemented (penalties, logprobs, tools, tool_choice "required", parallel tool
calls, response formats, ...) are refused rather than silently ignored, and each field's type is
checked strictly (true is not the number 1). A value quoted back in an error is cut to QUOTE_MAX
characters (fields.py: RequestError and the typed readers).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, replace
from typing import Any, Literal, NoReturn

from edgespec.config import METHODS, GenerationConfig, SamplingConfig, SpecConfig
from edgespec.errors import ConfigError
from edgespec.server.fields import (
    QUOTE_MAX,
    RequestError,
    boolean,
    integer,
    is_int,
    number,
    quoted,
)

MAX_TEMPERATURE = 2.0  # the OpenAI API's range is 0..2; far above it the answer is noise
MAX_STOPS = 16  # OpenAI allows 4; front-ends for local models often send a few more
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
# parse_special: /v1/completions may opt in to parsing special-token strings in its prompt
SPEC_FIELDS = ("k", "method", "adaptive", "k_max", "parse_special")
TEMPLATE_KWARGS = ("enable_thinking",)  # the chat_template_kwargs a request may set
# Sampling fields accepted only at their neutral value, and fields accepted only when off/empty.
NEUTRAL = {"presence_penalty": 0, "frequency_penalty": 0, "repetition_penalty": 1}
UNSUPPORTED = ("logprobs", "top_logprobs", "echo", "suffix", "logit_bias", "tools", "functions")
# Tool-choice fields: with no tools, "none" and "auto" ask for nothing; anything else would.
NO_TOOL_CHOICE = (None, "none", "auto")
DRAFT_METHODS = ("draft", "hybrid", "mtp", "block", "block-tree")  # they run a draft model


@dataclass(frozen=True)
class Defaults:
    """What a request gets for the fields it leaves out (the `edgespec serve` options)."""

    model_id: str
    config: GenerationConfig
    random_seed: bool = True  # a request without a seed gets a fresh one (else config's seed)
    has_draft: bool = True
    vocab_size: int = 0  # the target's vocabulary, the largest top_k (0: not checked)
    # The methods the served pair can run (served_methods); None: every method, the draft's
    # only with a draft.
    methods: tuple[str, ...] | None = None

    def runs(self) -> tuple[str, ...]:
        if self.methods is not None:
            return self.methods
        return tuple(m for m in METHODS if self.has_draft or m not in DRAFT_METHODS)


def served_methods(has_draft: bool, family: Any = None) -> tuple[str, ...]:
    """The speculation methods a loaded pair can run (its draft's family, edgespec.families):
    ngram and none always; draft and hybrid with any draft; block and block-tree with a block
    draft; mtp with the target's own MTP head.

    served_methods(False) -> ("ngram", "none")
    """
    blocks = bool(getattr(family, "blocks", False))
    own_head = bool(getattr(family, "own_head", False))
    needs = {"draft": has_draft, "hybrid": has_draft, "mtp": own_head}
    needs.update({"block": blocks and has_draft, "block-tree": blocks and has_draft})
    return tuple(m for m in METHODS if needs.get(m, True))


@dataclass(frozen=True)
class ParsedRequest:
    """One validated request. Exactly one of `messages` (chat) and `prompt` (completions) is set;
    a completions prompt is text (tokenized as is, no template) or token ids."""

    kind: Literal["chat", "completion"]
    model: str
    config: GenerationConfig
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    messages: tuple[dict[str, str], ...] | None = None
    prompt: str | tuple[int, ...] | None = None
    think: bool | None = None  # chat_template_kwargs.enable_thinking (None: the pair's default)
    parse_special: bool = False  # edgespec.parse_special: the prompt's special-token strings


def parse_body(raw: bytes) -> dict[str, Any]:
    """The JSON object of a request body, or RequestError."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestError(f"the request body is not valid JSON: {exc}") from None
    except RecursionError:  # thousands of nested arrays or objects: no request needs them
        raise RequestError("the request body nests too deeply to be a request") from None
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    return body


def parse_chat(body: dict[str, Any], defaults: Defaults) -> ParsedRequest:
    """A /v1/chat/completions body. Raises RequestError."""
    messages, think = _messages(body.get("messages")), _thinking(body)
    ext = body.get("edgespec")
    if isinstance(ext, dict) and "parse_special" in ext:
        _refuse("edgespec.parse_special", "is for /v1/completions; chat messages are text")
    return ParsedRequest("chat", messages=messages, think=think, **_common(body, defaults))


def parse_completion(body: dict[str, Any], defaults: Defaults) -> ParsedRequest:
    """A /v1/completions body. Raises RequestError."""
    prompt, ext = _prompt(body.get("prompt")), body.get("edgespec")
    if body.get("chat_template_kwargs") is not None:
        _refuse("chat_template_kwargs", "is for /v1/chat/completions (a prompt has no template)")
    special = isinstance(ext, dict) and boolean(ext, "parse_special", False, "edgespec.")
    if isinstance(ext, dict):  # the rest of `edgespec` is the speculation's
        body = dict(body, edgespec={k: v for k, v in ext.items() if k != "parse_special"})
    common = _common(body, defaults)
    return ParsedRequest("completion", prompt=prompt, parse_special=special, **common)


def _refuse(param: str, why: str) -> NoReturn:
    raise RequestError(f"{param} {why}", param=param)


def _thinking(body: dict[str, Any]) -> bool | None:
    """chat_template_kwargs.enable_thinking, or None when not set; other keys are refused."""
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        return None
    if not isinstance(kwargs, dict):
        _refuse("chat_template_kwargs", 'must be an object, e.g. {"enable_thinking": false}')
    for key in kwargs:
        if key not in TEMPLATE_KWARGS:
            name = f"chat_template_kwargs.{str(key)[:200]}"
            _refuse(name, f"is not supported (only {', '.join(TEMPLATE_KWARGS)})")
    if kwargs.get("enable_thinking") is None:
        return None
    return boolean(kwargs, "enable_thinking", False, "chat_template_kwargs.")


def _common(body: dict[str, Any], defaults: Defaults) -> dict[str, Any]:
    model = _model(body.get("model"), defaults.model_id)
    _refuse_unsupported(body)
    stream = boolean(body, "stream", False)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise RequestError("stream_options must be an object", param="stream_options")
    include_usage = bool(options and boolean(options, "include_usage", False, "stream_options."))
    config = GenerationConfig(
        sampling=_sampling(body, defaults),
        spec=_spec(body.get("edgespec"), defaults),
        max_tokens=_max_tokens(body, defaults.config.max_tokens),
    )
    return {
        "model": model,
        "config": config,
        "stop": _stop(body.get("stop")),
        "stream": stream,
        "include_usage": include_usage,
    }


def _model(value: Any, model_id: str) -> str:
    if value is None:
        return model_id
    if not isinstance(value, str):
        raise RequestError(
            f"model must be a string (this server's is {model_id!r}), got {quoted(value)}",
            param="model",
        )
    if value != model_id:
        raise RequestError(
            f"the model {quoted(value)} does not exist on this server; it serves {model_id!r} "
            "(GET /v1/models)",
            status=404,
            param="model",
            code="model_not_found",
        )
    return model_id


def _messages(value: Any) -> tuple[dict[str, str], ...]:
    if not isinstance(value, list) or not value:
        raise RequestError("messages must be a non-empty list", param="messages")
    out = []
    for i, m in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise RequestError(f"{where} must be an object with a role and content", param=where)
        role = m.get("role")
        if role not in ROLES:
            raise RequestError(
                f"{where}.role must be one of {', '.join(ROLES)} (got {quoted(role)}); tool messages "
                "are not supported",
                param=f"{where}.role",
            )
        out.append({"role": ROLES[role], "content": _content(m.get("content"), where)})
    return tuple(out)


def _content(value: Any, where: str) -> str:
    """A message's text: a string, or a list of text parts (joined by newlines)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for part in value:
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise RequestError(
                    f"{where}.content: only text parts are supported, got {quoted(kind)}",
                    param=f"{where}.content",
                )
            if not isinstance(part.get("text"), str):
                raise RequestError(f"{where}.content: a text part needs a string 'text'")
            texts.append(part["text"])
        return "\n".join(texts)
    raise RequestError(f"{where}.content must be a string", param=f"{where}.content")


def _prompt(value: Any) -> str | tuple[int, ...]:
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]  # one prompt in a list ([text] or [[ids]])
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(is_int(t) for t in value):
        return tuple(int(t) for t in value)
    raise RequestError(
        "prompt must be a string or a list of token ids (one prompt per request)", param="prompt"
    )


def _refuse_unsupported(body: dict[str, Any]) -> None:
    """Fields that would change the answer but are not implemented: refuse, never ignore."""
    for name in ("n", "best_of"):
        if integer(body, name, 1) != 1:
            raise RequestError(f"only {name}=1 (one answer per request) is supported", param=name)
    for name, neutral in NEUTRAL.items():
        if number(body, name, neutral) != neutral:
            raise RequestError(f"{name} is not supported (leave it out or {neutral})", param=name)
    for name in ("tool_choice", "function_call"):
        if body.get(name) not in NO_TOOL_CHOICE:
            raise RequestError(
                f"{name} {quoted(body.get(name))} is not supported: this server calls no tools "
                "(leave it out, 'none' or 'auto')",
                param=name,
            )
    if boolean(body, "parallel_tool_calls", False):
        raise RequestError(
            "parallel_tool_calls is not supported: this server calls no tools",
            param="parallel_tool_calls",
        )
    for name in UNSUPPORTED:
        if body.get(name) not in (None, False, 0, [], {}, ""):
            raise RequestError(f"{name} is not supported by this server", param=name)
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise RequestError(
            "response_format: only {'type': 'text'} is supported", param="response_format"
        )


def _sampling(body: dict[str, Any], defaults: Defaults) -> SamplingConfig:
    base = defaults.config.sampling
    values = {
        "temperature": number(body, "temperature", base.temperature),
        "top_p": number(body, "top_p", base.top_p),
        "top_k": integer(body, "top_k", base.top_k),
        "min_p": number(body, "min_p", base.min_p),
        "seed": integer(body, "seed", None),
    }
    if values["top_k"] == -1:
        values["top_k"] = 0  # -1 means "off" in vLLM and llama.cpp
    _check_ranges({k: v for k, v in values.items() if body.get(k) is not None}, defaults.vocab_size)
    if values["seed"] is None:
        values["seed"] = secrets.randbits(63) if defaults.random_seed else base.seed
    try:
        return replace(base, **values)
    except ConfigError as exc:
        raise RequestError(str(exc), param=_param_of(str(exc))) from None


def _check_ranges(values: dict[str, Any], vocab_size: int) -> None:
    """The fields a request set, in the OpenAI API's ranges (temperature 0..2) and top_k within
    the vocabulary; the other ranges (top_p in (0, 1], min_p in [0, 1), seed) are SamplingConfig's
    own. The server's defaults are not checked here: the command line allows more."""
    if not 0 <= values.get("temperature", 0) <= MAX_TEMPERATURE:
        raise RequestError(
            f"temperature must be between 0 and {MAX_TEMPERATURE:g} (as in the OpenAI API), "
            f"got {values['temperature']:g}",
            param="temperature",
        )
    top_k = values.get("top_k", 0)
    if vocab_size and top_k > vocab_size:
        raise RequestError(
            f"top_k must be between 0 and {vocab_size}, the model's vocabulary (0 or -1: off), "
            f"got {top_k}",
            param="top_k",
        )


def _spec(ext: Any, defaults: Defaults) -> SpecConfig:
    base = defaults.config.spec
    if ext is None:
        return base
    if not isinstance(ext, dict):
        raise RequestError(
            "edgespec must be an object {k, method, adaptive, k_max}", param="edgespec"
        )
    unknown = sorted(set(ext) - set(SPEC_FIELDS))
    if unknown:
        raise RequestError(
            f"edgespec: unknown field {quoted(unknown[0])} (known: {', '.join(SPEC_FIELDS)})",
            param=f"edgespec.{unknown[0][:QUOTE_MAX]}",
        )
    k = integer(ext, "k", base.k, "edgespec.")
    method = ext.get("method", base.method)
    if method not in METHODS:
        raise RequestError(
            f"edgespec.method must be one of {', '.join(METHODS)}, got {quoted(method)}",
            param="edgespec.method",
        )
    if method not in defaults.runs():
        raise RequestError(
            f"edgespec.method {method!r} {_why_not(method, defaults.has_draft)}; this server "
            f"runs {', '.join(defaults.runs())}",
            param="edgespec.method",
        )
    boolean(ext, "parse_special", False, "edgespec.")
    adaptive = boolean(ext, "adaptive", base.adaptive, "edgespec.")
    k_max = integer(ext, "k_max", base.k_max, "edgespec.")
    try:
        return replace(base, k=k, method=method, adaptive=adaptive, k_max=k_max)
    except ConfigError as exc:
        raise RequestError(f"edgespec: {exc}", param="edgespec") from None


def _why_not(method: str, has_draft: bool) -> str:
    """What a method the served pair cannot run needs."""
    if not has_draft:
        return "needs a draft model and this server has none"
    if method == "mtp":
        return "needs the target's own MTP head (serve --method mtp loads it)"
    return "needs a block draft (DFlash-style) and this server's draft is not one"


def _max_tokens(body: dict[str, Any], default: int) -> int:
    name = (
        "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    )
    value = integer(body, name, default)
    if value < 1:
        raise RequestError(f"{name} must be >= 1, got {value}", param=name)
    return value


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise RequestError("stop must be a non-empty string or a list of them", param="stop")
    if len(stops) > MAX_STOPS:
        raise RequestError(f"stop: at most {MAX_STOPS} strings, got {len(stops)}", param="stop")
    return tuple(stops)


def _param_of(message: str) -> str | None:
    """The request field a SamplingConfig message names ('top-p must be ...' -> 'top_p')."""
    word = message.split(" ", 1)[0].replace("-", "_")
    return word if word in ("temperature", "top_p", "top_k", "min_p", "seed") else None
