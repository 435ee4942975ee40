"""Word lists and templates for `instructions.py`, written for this project, never from a
benchmark. The lists live in lexicon.json (data, not code); each is an immutable tuple here."""

from __future__ import annotations

import json
from pathlib import Path

_DATA = json.loads(Path(__file__).with_name("lexicon.json").read_text(encoding="utf-8"))


def _words(name: str) -> tuple[str, ...]:
    return tuple(_DATA[name])


def _pairs(name: str) -> tuple[tuple[str, str], ...]:
    """A list of "a/b" strings as (a, b) pairs."""
    return tuple((a, b) for a, b in (p.split("/", 1) for p in _DATA[name]))


ADJECTIVES = _words("ADJECTIVES")
ADVICE_TEMPLATES = _words("ADVICE_TEMPLATES")
ANIMALS = _words("ANIMALS")
ASPECTS = _words("ASPECTS")
AUDIENCES = _words("AUDIENCES")
BRAINSTORM_TEMPLATES = _words("BRAINSTORM_TEMPLATES")
CHARACTERS = _words("CHARACTERS")
CITIES = _words("CITIES")
CLASSIFY_TASKS = _words("CLASSIFY_TASKS")
CODE_CONCEPTS = _words("CODE_CONCEPTS")
CODE_CONCEPT_TEMPLATES = _words("CODE_CONCEPT_TEMPLATES")
CODE_READ_ASKS = _words("CODE_READ_ASKS")
CODE_TASKS = _words("CODE_TASKS")
CODE_WRITE_TEMPLATES = _words("CODE_WRITE_TEMPLATES")
COMPARE_PAIRS = _pairs("COMPARE_PAIRS")
COMPARE_TEMPLATES = _words("COMPARE_TEMPLATES")
COUNTRIES = _pairs("COUNTRIES")
EMAIL_PURPOSES = _words("EMAIL_PURPOSES")
EMAIL_TEMPLATES = _words("EMAIL_TEMPLATES")
EXPLAIN_TEMPLATES = _words("EXPLAIN_TEMPLATES")
EXTRACT_TASKS = _words("EXTRACT_TASKS")
FACT_TEMPLATES = _words("FACT_TEMPLATES")
FIRST_NAMES = _words("FIRST_NAMES")
GENRES = _words("GENRES")
GROUPS = _words("GROUPS")
HOWTO_TEMPLATES = _words("HOWTO_TEMPLATES")
HUMANITIES_CONCEPTS = _words("HUMANITIES_CONCEPTS")
HUMAN_LANGUAGES = _words("HUMAN_LANGUAGES")
ITEMS = _words("ITEMS")
LANGUAGES = _words("LANGUAGES")
LAST_NAMES = _words("LAST_NAMES")
LIST_TEMPLATES = _words("LIST_TEMPLATES")
LIST_THINGS = _words("LIST_THINGS")
MATH_TEMPLATES = _words("MATH_TEMPLATES")
MONTHS = _words("MONTHS")
PASSAGE_SENTENCES = _words("PASSAGE_SENTENCES")
PASSAGE_TASKS = _words("PASSAGE_TASKS")
PERSONAS = _words("PERSONAS")
POEM_FORMS = _words("POEM_FORMS")
POEM_TEMPLATES = _words("POEM_TEMPLATES")
PY_SNIPPETS = _pairs("PY_SNIPPETS")
REASONING_TEMPLATES = _words("REASONING_TEMPLATES")
RECIPIENTS = _words("RECIPIENTS")
REVIEW_SENTENCES = _words("REVIEW_SENTENCES")
ROLEPLAY_REQUESTS = _words("ROLEPLAY_REQUESTS")
ROLEPLAY_TEMPLATES = _words("ROLEPLAY_TEMPLATES")
SETTINGS = _words("SETTINGS")
SITUATIONS = _words("SITUATIONS")
STEM_CONCEPTS = _words("STEM_CONCEPTS")
STORY_EVENTS = _words("STORY_EVENTS")
STORY_TEMPLATES = _words("STORY_TEMPLATES")
STYLES = _words("STYLES")
TASKS = _words("TASKS")
TONES = _words("TONES")
TOPICS = _words("TOPICS")
WRITING_FORMS = _words("WRITING_FORMS")
WRITING_TEMPLATES = _words("WRITING_TEMPLATES")
