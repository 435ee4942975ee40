"""Wordings of the requests built on real passages (requests.py): written for this project,
never taken from a benchmark. "|" separates alternatives; `{p}` is the passage, other fields are
filled by the builders. Several wordings per task, so the draft sees how people really vary them.
"""

from __future__ import annotations


def _s(text: str) -> tuple[str, ...]:
    return tuple(x.strip().replace("\\n", "\n") for x in text.split("|") if x.strip())


SUMMARIZE = _s(
    "Summarize the following text in {n} sentences.\\n\\n{p}|"
    "Summarize:\\n{p}|"
    "Give me a short summary of this:\\n\\n{p}|"
    "{p}\\n\\nSummarize the text above in a few sentences.|"
    "TL;DR of the following, please:\\n\\n{p}|"
    "What are the key points of this excerpt? Use bullet points.\\n\\n{p}|"
    "Condense this into a single sentence:\\n\\n{p}|"
    "Here is part of the documentation of {title}. Summarize what it says for {audience}.\\n\\n{p}|"
    "Write a one-paragraph summary of the text below.\\n\\n{p}|"
    "Can you summarise this for me? I don't have time to read it all.\\n\\n{p}|"
    "Read the following and write a brief abstract (at most {w} words).\\n\\n{p}|"
    "Summarize this text and then list three questions it leaves open.\\n\\n{p}"
)
SUMMARIZE_TWO = _s(
    "Summarize the two excerpts below, then say what they have in common.\\n\\n"
    "Excerpt 1:\\n{p}\\n\\nExcerpt 2:\\n{q}|"
    "Give a short summary of each of these texts.\\n\\nText A:\\n{p}\\n\\nText B:\\n{q}"
)
QA_CONTEXT = _s(
    "{p}\\n\\n{question}|"
    "Answer the question using only the text below.\\n\\nText:\\n{p}\\n\\nQuestion: {question}|"
    "Context:\\n{p}\\n\\nQuestion: {question}\\nAnswer:|"
    "Read this and answer: {question}\\n\\n{p}|"
    "Based on the following passage, {question_lc}\\n\\n{p}|"
    "Here is an excerpt from {title}:\\n\\n{p}\\n\\nQ: {question}|"
    "I found this in the documentation:\\n\\n{p}\\n\\n{question} Please quote the relevant part."
)
RAG = _s(
    "Use the documents below to answer the question. Say which document supports your answer.\\n\\n"
    "{docs}\\n\\nQuestion: {question}|"
    "{docs}\\n\\nAnswer using only the information above: {question}|"
    "You are given several documents.\\n\\n{docs}\\n\\nBased on these documents, {question_lc}"
)
Q_DOCSTRING = _s(
    "What does `{name}` do?|What does `{name}` return?|"
    "Which arguments does `{name}` accept, and what do they mean?|"
    "When would I use `{name}`?|What is the purpose of `{name}`, according to this docstring?|"
    "Are there any special cases or exceptions mentioned for `{name}`?|"
    "How would I call `{name}`? Give a short example."
)
Q_REFERENCE = _s(
    "What does the option `{opt}` do?|What is `{title}` used for?|"
    "According to this manual excerpt, what does {kw} mean?|"
    "What should I know before using {kw}?|What is this section of the {title} manual about?|"
    "How does {title} handle {kw}?"
)
Q_PROSE = _s(
    "What does the text say about {kw}?|What is the main point of this text?|"
    "According to the passage, why does {kw} matter?|Which people or projects are mentioned, "
    "and what did they do?|What problem does the text describe, and what is the solution?|"
    "What is {kw}, according to the text?|Is there any limitation or warning in this text?"
)
Q_LEGAL = _s(
    "Am I allowed to modify and redistribute the software under these terms?|"
    "What must I include when I redistribute this software?|Does this text give any warranty?|"
    "Who holds the copyright, according to this text?|Which licence applies here?|"
    "Can I use this in a commercial product?|What happens if I do not follow these conditions?"
)
Q_CHANGELOG = _s(
    "What changed in version {ver}?|Who made this release, and when?|"
    "Which bugs were closed in this entry?|Was this a security fix? How can you tell?|"
    "What is the urgency of this upload and what does it mean?|"
    "Summarize the changes in this entry for a user."
)
Q_RECORD = _s(
    "What does the package {title} do?|How much disk space does {title} need, in megabytes?|"
    "Who maintains {title}?|What does {title} depend on?|Which version of {title} is this?|"
    "Where can I find more information about {title}?"
)
Q_CODE = _s(
    "What does `{name}` return?|What are the inputs of `{name}`?|"
    "Can `{name}` raise an exception? When?|Which other functions does `{name}` call?"
)
Q_CLOSED = _s(
    "what is {title} used for|What is {title}?|what does the {cmd} command do in linux|"
    "Which tool would you use to {desc_lc}?|what is the python module {module} for|"
    "Who created the {licence}?|What is the difference between the {licence} and the {licence2}?|"
    "is {title} free software|What is the capital of {country}?|when was {concept} discovered|"
    "How does {concept} work?|what does {desc_lc} mean|How long do {animal} live?|"
    "Why is {concept} important?|what year did {concept} become widely known|"
    "How do I install {title} on Debian?|What does the {module} module do in Python?"
)
EXTRACT = _s(
    "Extract all the names, email addresses and dates from the text below. Answer in JSON.\\n\\n{p}|"
    "List every number in this text with what it refers to.\\n\\n{p}|"
    "From the following text, extract the key technical terms and define each in one line.\\n\\n{p}|"
    "{p}\\n\\nExtract the important facts above as a bulleted list.|"
    "Pull out every file path, command or option mentioned in this text.\\n\\n{p}|"
    "Read the text and fill in this template: Subject: ... / Purpose: ... / Requirements: ... / "
    "Caveats: ...\\n\\n{p}|"
    "Rate how easy this text is to understand on a scale of 1 to 5 and explain your rating.\\n\\n{p}"
)
EXTRACT_FORM = {
    "changelog": _s(
        "Extract the package name, version, distribution, urgency, maintainer and date from this "
        "changelog entry. Answer in JSON.\\n\\n{p}|List every bug number closed in this entry.\\n\\n{p}|"
        "Turn this changelog entry into a YAML record.\\n\\n{p}"
    ),
    "record": _s(
        "Convert this package record into a JSON object with the keys name, version, size_kb, "
        "maintainer and summary.\\n\\n{p}|Extract the maintainer's name and email from this "
        "record.\\n\\n{p}|List the dependencies of this package with their version constraints."
        "\\n\\n{p}|Make a Markdown table with one row per field of this record.\\n\\n{p}"
    ),
    "legal": _s(
        "List every copyright holder mentioned below with the years.\\n\\n{p}|"
        "Which licences are named in this text? Give a list.\\n\\n{p}|"
        "Extract the conditions of this licence as a numbered list.\\n\\n{p}"
    ),
    "docstring": _s(
        "Extract the parameters described in this docstring as JSON objects with name, type and "
        "description.\\n\\n{p}|List the exceptions and special cases this documentation mentions."
        "\\n\\n{p}|Make a table of the arguments of `{title}` and what each does.\\n\\n{p}"
    ),
    "reference": _s(
        "List all command-line options mentioned below with a one-line description each, as a "
        "Markdown table.\\n\\n{p}|Extract every file path and environment variable mentioned in this "
        "manual excerpt.\\n\\n{p}"
    ),
    "code": _s(
        "List the functions and methods this code calls.\\n\\n```python\\n{p}\\n```|"
        "Which variables does this function define, and what is each for?\\n\\n```python\\n{p}\\n```"
    ),
}
REWRITE = _s(
    "Rewrite this in plain English for {audience}.\\n\\n{p}|"
    "Make the following text more {tone}.\\n\\n{p}|Paraphrase the following text.\\n\\n{p}|"
    "Rewrite the following as a short email to {recipient}.\\n\\n{p}|"
    "Shorten this to at most {n} sentences, keeping the key facts.\\n\\n{p}|"
    "Turn this into a step-by-step list.\\n\\n{p}|Improve the grammar and flow of this text:\\n\\n{p}|"
    "Rewrite this paragraph so that {audience} can understand it.\\n\\n{p}|"
    "Rewrite the text below as a short news report.\\n\\n{p}|"
    "Rewrite this as if a pirate were explaining it.\\n\\n{p}|"
    "Please rephrase this in a {tone} tone:\\n{p}|"
    "{p}\\n\\nRewrite the text above in the first person.|"
    "Edit this text to be clearer and more concise.\\n\\n{p}"
)
REWRITE_FORM = {
    "legal": _s("Rewrite this legal text in everyday language.\\n\\n{p}"),
    "changelog": _s("Rewrite this changelog entry as a friendly release note for users.\\n\\n{p}"),
    "docstring": _s(
        "Rewrite this docstring in Google style (Args, Returns, Raises).\\n\\n{p}|"
        "Rewrite this documentation so a beginner can follow it.\\n\\n{p}"
    ),
    "record": _s("Rewrite this package record as a friendly paragraph.\\n\\n{p}"),
}
TRANSLATE_TO = _s(
    "Translate into {lang}:\\n\\n{p}|Translate the following text into {lang}.\\n\\n{p}|"
    "How would you say this in {lang}?\\n\\n{p}|Please translate this to {lang}:\\n{p}|"
    "Translate English to {lang}: {p}|{p}\\n\\nTranslate the text above into {lang}.|"
    "Can you translate this paragraph from the {title} documentation into {lang}?\\n\\n{p}"
)
TRANSLATE_FROM = _s(
    "Translate {src} to English: {p}|Translate from {src} into English:\\n\\n{p}|"
    "What does this mean in English?\\n\\n{p}|Please translate this {src} text into English.\\n\\n{p}|"
    "Translate to English:\\n{p}|{p}\\n\\nTranslate this into English.|"
    "I received this message in {src}. Can you translate it?\\n\\n{p}|"
    "Translate the following {src} sentence into {lang}: {p}"
)
CODE_EXPLAIN = _s(
    "Explain what this Python function does.|What does this code do? Walk me through it.|"
    "Is there a bug in this code? Explain.|How could this function be made more readable?|"
    "Add comments to this code explaining each step.|Write unit tests for this function with "
    "pytest.|What is the time complexity of this function?|Add type hints and a docstring to this "
    "function.|Convert this Python code to {lang}.|Explain this code to a beginner.|"
    "Suggest better names for the variables in this code.|Simplify this function if you can."
)
CODE_WRITE = _s(
    'Write a Python function `{sig}` that does what this docstring describes:\\n\\n"""\\n{p}\\n"""|'
    "Implement the following in {lang}:\\n\\n{p}|"
    "Here is the documentation of `{name}`. Write your own implementation of it.\\n\\n{p}|"
    "Write a Python function that behaves as described below, with a docstring and an example."
    "\\n\\n{p}"
)
CODE_WRITE_TOOL = _s(
    "Write a Python script that imitates the basic behaviour of the `{title}` command: {summary}|"
    "Write a {lang} program that {summary_lc}|How would I {summary_lc} from a shell script? "
    "Show the commands.|Write a short Python function that uses `{title}` through subprocess and "
    "returns its output."
)
MATH_REAL = _s(
    "The package {a} needs {x} kB of disk space and {b} needs {y} kB. How many megabytes do they "
    "need together? (1 MB = 1024 kB)|A package of {x} kB is downloaded at {r} kB per second. How "
    "many seconds does the download take?|{a} takes {x} kB. If a system has {n} packages of that "
    "size, how many gigabytes is that?|Version {v1} of {a} was released in {y1} and version {v2} "
    "in {y2}. If releases are evenly spaced and there were {n} releases in between, how many "
    "months apart are they on average?|A mirror serves {a} ({x} kB) to {n} users a day. How much "
    "data is that per week, in megabytes?|The packages {a}, {b} and {c} need {x}, {y} and {z} kB. "
    "What is their average size, and which is largest?"
)
CHAT = _s(
    "Write a short blog post about {topic}.|Tell me a fun fact about {topic}.|"
    "What are the pros and cons of {topic}?|I want to learn about {topic}. Where should I start?|"
    "Write a haiku about {topic}.|Write a limerick about {topic}.|"
    "hi! can you help me understand {topic}?|Give me {n} ideas for a weekend project involving "
    "{topic}.|Write a motivational message for someone struggling with {topic}.|"
    "Compose a short speech introducing {topic} to {audience}.|"
    "Write a product description for {title}: {summary}|What do you think about {topic}?|"
    "Write a short story where {character} discovers {topic}.|"
    "Draft a tweet announcing {title} {ver}.|Explain {topic} to {audience} in three paragraphs.|"
    "Write an email to my team proposing that we adopt {title}.|"
    "Write a poem about {topic} in the style of a nursery rhyme.|"
    "I have to give a 5-minute talk about {topic}. Can you outline it?"
)
PERSONAS = _s(
    "a grumpy senior system administrator|a patient Python tutor|the maintainer of {title}|"
    "a Linux command that has come to life|a customer support agent for {title}|"
    "a lawyer who specialises in open-source licences|a pirate captain|a medieval knight|"
    "a friendly robot|a detective in the 1920s|a wise old wizard|a sports commentator|"
    "a kindergarten teacher|a time traveller from the year 3000|a job interviewer|"
    "a stand-up comedian|a museum guide|a cheerful barista|a strict but fair math teacher"
)
ROLEPLAY = _s(
    "Pretend to be {persona}. {request}|Act as {persona}. {request}|"
    "Let's role-play: you are {persona} and I am a newcomer. {request}|"
    "From now on you are {persona}; stay in character. {request}|"
    "Imagine you are {persona}. {request}"
)
ROLEPLAY_SYSTEM = _s("You are {persona}. Stay in character.|Play the role of {persona}.")
ROLEPLAY_REQUESTS = _s(
    "Introduce yourself and describe a typical day.|A user asks what {title} does. Answer them.|"
    "Explain this to me, based on the excerpt below:\\n\\n{p}|"
    "Tell me why I should care about {topic}.|Give me your best advice about {topic}.|"
    "I'm nervous about {topic}. Can you reassure me?|React to this news: {summary}|"
    "Describe {topic} as only you would."
)
FOLLOWUP = _s(
    "Can you make that shorter?|Now explain it to a ten-year-old.|Give me an example.|"
    "Translate your answer into {lang}.|Can you put that in a table?|Why?|"
    "Rewrite your answer as bullet points.|Are you sure? Please double-check.|Continue.|"
    "Thanks! Can you go into more detail on the first point?|What would be a counter-argument?|"
    "Summarize your answer in one sentence.|Can you say that more formally?|"
    "What should I do next?|Give me three more ideas."
)
FOLLOWUP_KIND = {
    "summarize": _s("Now give it a title.|What is the most surprising part?"),
    "translate": _s("Now translate it into {lang}.|Which words were hardest to translate?"),
    "code_explain": _s("Now add type hints.|Write a test for it.|Rewrite it in {lang}."),
    "code_write": _s("Now add error handling.|Write tests for your function.|Make it faster."),
    "math": _s("What if all the numbers were doubled?|Check your answer another way."),
    "roleplay": _s("Stay in character: what is your biggest fear?|What would you tell a beginner?"),
    "extract": _s("Now as CSV, please.|Which of these is the most important?"),
    "qa_context": _s("Where exactly does the text say that?|What else does the text mention?"),
}
PROMPT_WRITING = _s(
    "Write one question that {audience} might ask about {topic}. Reply with the question only.|"
    "Invent a realistic request a user might send to an AI assistant about {topic}. Write only "
    "the request.|Write a short exam question about {topic}. Do not answer it.|"
    "Suggest one question that tests whether someone understood this text. Write only the "
    "question.\\n\\n{p}|Write a quiz question about {topic}, without the answer.|"
    "Give me a tricky question about {topic} that a curious student might ask. Only the question."
)
AUDIENCES = _s(
    "a ten-year-old|a beginner|a busy manager|a retired teacher|a software engineer|"
    "a first-year student|a non-native English speaker|an expert|a new employee|my grandmother"
)
TONES = _s("formal|casual|friendly|professional|enthusiastic|polite|neutral|humorous")
RECIPIENTS = _s("my manager|a colleague|a customer|the whole team|a friend|the project maintainers")
LANGS = _s(
    "French|Spanish|German|Chinese|Japanese|Italian|Portuguese|Russian|Dutch|Korean|Polish|Arabic"
)
CODE_LANGS = _s("JavaScript|Rust|Go|C|Java|TypeScript|C++|Ruby|Bash")
LANG_NAMES = {
    "de": "German",
    "fr": "French",
    "es": "Spanish",
    "it": "Italian",
    "nl": "Dutch",
    "pt": "Portuguese",
    "sv": "Swedish",
    "pl": "Polish",
    "ru": "Russian",
    "ja": "Japanese",
    "zh": "Chinese",
    "en": "English",
}
