"""Request validation and response shapes of `edgespec serve` (pure: no models, no HTTP)."""

from __future__ import annotations

import pytest

from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.events import Stats
from edgespec.server import responses as R
from edgespec.server.protocol import (
    QUOTE_MAX,
    Defaults,
    RequestError,
    parse_body,
    parse_chat,
    parse_completion,
    quoted,
    served_methods,
)
from edgespec.server.stops import Segment

openai_types = pytest.importorskip("openai.types")

BASE = GenerationConfig(
    SamplingConfig(temperature=0.0), SpecConfig(k=4, method="hybrid", adaptive=False), 512
)
DEFAULTS = Defaults("pair", BASE, random_seed=False, has_draft=True)
MSG = [{"role": "user", "content": "Hi"}]


def chat(**body):
    return parse_chat({"messages": MSG, **body}, DEFAULTS)


def test_defaults_fill_what_a_request_leaves_out():
    r = chat()
    assert r.kind == "chat" and r.model == "pair" and r.config == BASE
    assert r.stop == () and not r.stream and not r.include_usage
    assert r.messages == ({"role": "user", "content": "Hi"},)


def test_fields_are_honoured():
    r = chat(
        model="pair",
        max_completion_tokens=7,
        temperature=0.7,
        top_p=0.9,
        top_k=20,
        min_p=0.05,
        seed=3,
        stop="\n",
        stream=True,
        stream_options={"include_usage": True},
        edgespec={"k": 2, "method": "ngram", "adaptive": False},
    )
    s = r.config.sampling
    assert (s.temperature, s.top_p, s.top_k, s.min_p, s.seed) == (0.7, 0.9, 20, 0.05, 3)
    assert r.config.max_tokens == 7 and r.stop == ("\n",) and r.stream and r.include_usage
    assert (r.config.spec.k, r.config.spec.method, r.config.spec.adaptive) == (2, "ngram", False)
    assert chat(max_tokens=9).config.max_tokens == 9
    assert chat(top_k=-1).config.sampling.top_k == 0  # vLLM / llama.cpp's "off"


def test_text_parts_and_roles():
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    r = parse_chat({"messages": [{"role": "developer", "content": parts}]}, DEFAULTS)
    assert r.messages == ({"role": "system", "content": "a\nb"},)


def test_a_request_without_a_seed_gets_a_fresh_one_when_the_server_says_so():
    fresh = Defaults("pair", BASE, random_seed=True)
    seeds = {parse_chat({"messages": MSG}, fresh).config.sampling.seed for _ in range(5)}
    assert len(seeds) == 5
    assert parse_chat({"messages": MSG, "seed": 9}, fresh).config.sampling.seed == 9


def test_completion_prompts():
    assert parse_completion({"prompt": "abc"}, DEFAULTS).prompt == "abc"
    assert parse_completion({"prompt": ["abc"]}, DEFAULTS).prompt == "abc"
    assert parse_completion({"prompt": [1, 2, 3]}, DEFAULTS).prompt == (1, 2, 3)
    assert parse_completion({"prompt": [[1, 2]]}, DEFAULTS).prompt == (1, 2)


BAD = [
    ({"messages": []}, 400, "messages", "non-empty"),
    ({"messages": "hi"}, 400, "messages", "non-empty"),
    ({"messages": [{"role": "tool", "content": "x"}]}, 400, "messages[0].role", "tool"),
    ({"messages": [{"role": "user", "content": 3}]}, 400, "messages[0].content", "string"),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        400,
        "messages[0].content",
        "image_url",
    ),
    ({"model": "gpt-4"}, 404, "model", "does not exist"),
    ({"temperature": -1}, 400, "temperature", "temperature"),
    ({"temperature": "hot"}, 400, "temperature", "number"),
    ({"top_p": 0}, 400, "top_p", "top-p"),
    ({"top_k": 1.5}, 400, "top_k", "integer"),
    ({"min_p": 1}, 400, "min_p", "min-p"),
    ({"seed": -2}, 400, "seed", "seed"),
    ({"max_tokens": 0}, 400, "max_tokens", ">= 1"),
    ({"max_completion_tokens": "a"}, 400, "max_completion_tokens", "integer"),
    ({"n": 2}, 400, "n", "n=1"),
    ({"stop": ""}, 400, "stop", "stop"),
    ({"stop": ["a"] * 17}, 400, "stop", "at most"),
    ({"stream": "yes"}, 400, "stream", "true or false"),
    ({"stream_options": {"include_usage": 1}}, 400, "stream_options.include_usage", "true"),
    ({"presence_penalty": 0.5}, 400, "presence_penalty", "not supported"),
    ({"logprobs": True}, 400, "logprobs", "not supported"),
    ({"tools": [{"type": "function"}]}, 400, "tools", "not supported"),
    ({"response_format": {"type": "json_object"}}, 400, "response_format", "text"),
    ({"edgespec": {"k": 0}}, 400, "edgespec", "K"),
    ({"edgespec": {"k": 2, "method": "magic"}}, 400, "edgespec.method", "magic"),
    ({"edgespec": {"adaptive": "no"}}, 400, "edgespec.adaptive", "true or false"),
    ({"edgespec": {"depth": 3}}, 400, "edgespec.depth", "unknown field"),
    ({"edgespec": 4}, 400, "edgespec", "object"),
]


@pytest.mark.parametrize(("body", "status", "param", "words"), BAD)
def test_every_bad_field_is_refused_with_its_name(body, status, param, words):
    with pytest.raises(RequestError) as info:
        parse_chat({"messages": MSG, **body}, DEFAULTS)
    err = info.value
    assert (err.status, err.param) == (status, param)
    assert words in err.message and "\n" not in err.message


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("temperature", 1e9, "between 0 and 2 (as in the OpenAI API), got 1e+09"),
        ("temperature", 2.01, "between 0 and 2"),
        ("top_k", 10**9, "between 0 and 384, the model's vocabulary"),
        ("top_p", 0, "(0, 1]"),
        ("min_p", 1, "[0, 1)"),
        ("seed", 2**64, "2**64"),
    ],
)
def test_sampling_fields_out_of_range_are_refused(field, value, words):
    vocab = Defaults("pair", BASE, random_seed=False, vocab_size=384)
    with pytest.raises(RequestError) as info:
        parse_chat({"messages": MSG, field: value}, vocab)
    assert (info.value.status, info.value.param) == (400, field)
    assert words in info.value.message
    edges = parse_chat({"messages": MSG, "temperature": 2, "top_k": 384}, vocab).config.sampling
    assert (edges.temperature, edges.top_k) == (2.0, 384)


def test_the_servers_own_defaults_are_not_held_to_the_request_ranges():
    hot = GenerationConfig(SamplingConfig(temperature=3.0, top_k=999), BASE.spec, 512)
    r = parse_chat({"messages": MSG}, Defaults("pair", hot, random_seed=False, vocab_size=384))
    assert (r.config.sampling.temperature, r.config.sampling.top_k) == (3.0, 999)


def test_the_thinking_switch_as_vllm_and_sglang_take_it():
    assert chat().think is None  # the pair's default
    assert chat(chat_template_kwargs={"enable_thinking": False}).think is False
    assert chat(chat_template_kwargs={"enable_thinking": True}).think is True
    assert chat(chat_template_kwargs={}).think is None
    for kwargs, param in [
        ({"enable_thinking": "no"}, "chat_template_kwargs.enable_thinking"),
        ({"enable_thinking": False, "tools_format": 1}, "chat_template_kwargs.tools_format"),
        ("no thinking", "chat_template_kwargs"),
    ]:
        with pytest.raises(RequestError) as info:
            chat(chat_template_kwargs=kwargs)
        assert info.value.status == 400 and info.value.param == param
    with pytest.raises(RequestError) as info:
        parse_completion({"prompt": "hi", "chat_template_kwargs": {}}, DEFAULTS)
    assert info.value.param == "chat_template_kwargs" and "chat/completions" in str(info.value)


def test_special_parsing_is_asked_for_on_completions_only():
    plain = parse_completion({"prompt": "a<|im_end|>"}, DEFAULTS)
    assert plain.parse_special is False
    ext = {"parse_special": True, "k": 2}
    asked = parse_completion({"prompt": "a<|im_end|>", "edgespec": ext}, DEFAULTS)
    assert asked.parse_special is True and asked.config.spec.k == 2
    with pytest.raises(RequestError) as info:
        parse_completion({"prompt": "a", "edgespec": {"parse_special": 1}}, DEFAULTS)
    assert info.value.param == "edgespec.parse_special"
    with pytest.raises(RequestError) as info:
        chat(edgespec={"parse_special": True})
    assert info.value.param == "edgespec.parse_special" and "text" in str(info.value)


def test_draft_methods_are_refused_without_a_draft():
    no_draft = Defaults("pair", BASE, random_seed=False, has_draft=False)
    with pytest.raises(RequestError, match="needs a draft model"):
        parse_chat({"messages": MSG, "edgespec": {"method": "draft"}}, no_draft)
    ok = parse_chat({"messages": MSG, "edgespec": {"method": "none"}}, no_draft)
    assert not ok.config.spec.enabled


def test_bodies_that_are_not_json_objects():
    deep = b"[" * 100_000  # json.loads runs out of stack (RecursionError), not a 500
    for raw, words in [
        (b"{bad", "not valid JSON"),
        (b"[1]", "JSON object"),
        (b"\xff", "JSON"),
        (deep, "nests too deeply"),
    ]:
        with pytest.raises(RequestError, match=words):
            parse_body(raw)
    with pytest.raises(RequestError, match="prompt must be"):
        parse_completion({"prompt": [1, "a"]}, DEFAULTS)


STATS = Stats(
    tokens=12,
    rounds=4,
    drafted=10,
    accepted=8,
    acceptance=0.8,
    tau=3.0,
    ttft=0.05,
    decode_time=0.5,
    tokens_per_s=22.0,
    prompt_tokens=30,
    prefilled_tokens=6,
)
USAGE = R.Usage.of(STATS, completion_tokens=10, method="hybrid")


def test_responses_parse_with_the_official_client_types():
    from openai.types import Completion
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    body = R.chat_response("chatcmpl-1", 1, "pair", "hello", "stop", USAGE)
    parsed = ChatCompletion.model_validate(body)
    assert parsed.choices[0].message.content == "hello"
    assert parsed.usage.prompt_tokens_details.cached_tokens == 24
    extra = parsed.usage.model_extra
    assert extra["prefilled_tokens"] == 6
    assert extra["speculation"]["tokens_per_round"] == 3.0
    assert extra["speculation"]["acceptance"] == 0.8
    assert (extra["speculation"]["ttft_s"], extra["speculation"]["decode_s"]) == (0.05, 0.5)
    segs = [Segment("he", "accepted"), Segment("llo", "bonus")]
    c = ChatCompletionChunk.model_validate(R.chunk("chat", "c", 1, "pair", segments=segs))
    assert c.choices[0].delta.content == "hello"
    assert c.choices[0].model_extra["provenance"] == [
        {"text": "he", "kind": "accepted"},
        {"text": "llo", "kind": "bonus"},
    ]
    last = ChatCompletionChunk.model_validate(R.chunk("chat", "c", 1, "pair", usage=USAGE))
    assert last.choices == [] and last.usage.completion_tokens == 10
    comp = Completion.model_validate(
        R.completion_response("cmpl-1", 1, "pair", "x", "length", USAGE)
    )
    assert comp.choices[0].text == "x" and comp.usage.total_tokens == 40


def test_served_methods_follow_the_draft_family():
    from types import SimpleNamespace

    token = SimpleNamespace(blocks=False, own_head=False)
    block = SimpleNamespace(blocks=True, own_head=False)
    head = SimpleNamespace(blocks=False, own_head=True)
    assert served_methods(False) == ("ngram", "none")
    assert served_methods(True, token) == ("draft", "ngram", "hybrid", "none")
    assert {"block", "block-tree"} <= set(served_methods(True, block))
    assert "mtp" in served_methods(True, head) and "block" not in served_methods(True, head)
    only_token = Defaults("pair", BASE, has_draft=True, methods=served_methods(True, token))
    body = {"messages": [{"role": "user", "content": "hi"}], "edgespec": {"method": "block"}}
    with pytest.raises(RequestError, match="needs a block draft") as err:
        parse_chat(body, only_token)
    assert err.value.param == "edgespec.method"


def test_quoted_values_are_cut_to_quote_max():
    assert quoted("abc") == "'abc'"
    long = quoted("x" * 10_000)
    assert len(long) == QUOTE_MAX + 3 and long.endswith("...")
    with pytest.raises(RequestError) as err:
        parse_chat({"messages": [{"role": "r" * 5000, "content": "hi"}]}, DEFAULTS)
    assert len(err.value.message) < QUOTE_MAX + 200
