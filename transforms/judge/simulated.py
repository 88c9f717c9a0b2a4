"""The deterministic simulated answers of a dry run: what a judge would answer to a request,
by fixed word rules (no model, no server, no state). A dry run (--judge_dry_run) answers every
request with them (simulated_content), so that multi-step metrics go on to their later steps
and those calls are counted too; the stand-in judge server (`evalbeam judge-server`,
pipelines/runners/stand_in.py) answers its HTTP requests with the same rules.

Everything is a pure function of the request, so the same request always gets the same answer:

* Subject and reference: when the last user message ends with `input: {JSON object}` (and
  optionally a final `Output:`), the format RAGAS's prompts use, the subject is the value of its
  first field among statements, claims, answer, response, user_answer, summary, text, sentence,
  context (else its last field; a list of strings stays a list) and the reference is the text of
  the other fields. Otherwise: in the last user message, the last marker `statement(s):`, `claim(s):`,
  `answer:`, `response:`, `actual output:`, `output:` or `opinion(s):` (case-insensitive) splits it;
  the subject is the text after the marker and the reference is every other piece of prompt text
  (system and earlier messages, plus the part before the marker). Without a marker the subject is the
  whole last user message and the reference is all other messages. The text of a message is its
  string content, or the "text" of its content parts.
* Sentences of a text: a JSON list of strings is taken as it is; otherwise split after . ! ? and at
  line breaks, bullets ("- ", "* ", "1. ") stripped, empty pieces dropped.
* Overlap of a text with the reference: content words (lower-cased `\\w+` of 3+ characters or digits,
  minus a few stop words) of the text that also occur in the reference, divided by its content words
  (0 when it has none).
* Contradiction (`contradiction`): a sentence of the text contradicts a sentence of the case's own
  reference text (the part of the last user message before the marker, or the input object's other
  fields; never the system text or the few-shot examples) when it names a name or a number that
  sentence does not have, that sentence names another one of the same kind in its place, and
  everything else (their content words, names and numbers) is the same: "The Eiffel Tower is in
  Rome." against "The Eiffel Tower is in Paris.", "It closes at 8 p.m." against "It closes at 5 p.m.".
  Names are capitalised content words other than a sentence's first word; numbers are digit runs
  (with . or , inside). A contradicted text has overlap 0.
* Verdict = overlap >= 0.5 (and so never for a contradicted text); but when the first sentence of
  the first message asks about a contradiction (it holds the word "contradict", as the Hallucination
  template's "You check whether a response contradicts a context passage."), the verdict is whether
  the text contradicts the reference.
* Labelled sections: a line holding only "Label:" starts a section of the last user message. An
  array property named `<word>_...` (answer_verdicts, reference_verdicts) whose <word> is the first
  word of a section's label ("Answer statements:") gets one item per sentence of that section, each
  judged against the other sections (AnswerCorrectness judges the answer's statements against the
  reference's and the reference's against the answer's).
* json_schema: the schema is walked (`SchemaWriter`): objects get every property (strict mode wants
  them all); arrays get one item per sentence of the subject (clamped to minItems/maxItems) and each
  item is judged on its own sentence (see labelled sections for arrays named after a section);
  strings named like statement/claim/opinion/truth/text take the
  sentence, other strings a fixed reason sentence (padded/cut to minLength/maxLength; `format` and
  `pattern` are ignored); booleans and yes/no/idk/0/1 enums follow the verdict (never "idk"); integers
  named verdict/attributed/... are 1/0; other numbers are min + overlap * (max - min) within the bounds
  (default 0..1; integers rounded); other enums are ordered values picked at round(overlap * (k - 1))
  for numbers, or by a hash of the request and field for strings; `$ref` into `#/$defs` or
  `#/definitions`, `anyOf`/`oneOf` (first non-null branch), `allOf` (first branch) and `const` work.
  An integer without bounds whose description lists its values ("rating (0, 2, or 4)") takes the
  listed value at round(overlap * (k - 1)).
* json_object, or no response_format, with a JSON schema written in the prompt (a JSON object with
  "properties" in any message, as instructor's JSON mode, RAGAS's prompts and evalbeam's own
  fallbacks write it): that schema is walked as for json_schema, and the answer is its JSON.
* json_object without a schema in the prompt: {"verdict": 1|0, "reason": "..."} for the whole subject.
* Plain text: "<score> <sentence>", score = 1 + round(4 * overlap) (a 1-5 rating first; 1 for a
  contradicted text); but when
  the last user message ends with "Reply with only one of these numbers: a, b, c." (evalbeam's
  rating templates) the answer is only the number at round(overlap * (k - 1)) of that list.
* Prompt log-probabilities (`prompt_logprobs`): the prompt is cut into tokens, each `\\w+` run
  or punctuation character with the whitespace before it (trailing whitespace is a token of its
  own); the first token's log-probability is None, and token i's is log 0.6 when its word
  (lower-cased, without the whitespace) occurred earlier in the prompt, else
  log(0.01 + 0.29 u) with u in [0, 1) from the sha256 of the previous and the current token: a
  copying bigram model, so a text that repeats the prompt's words is likelier.
* Embeddings (`embed`): every content word hashed (sha256) to one of `dimensions` (default 64)
  slots with a hashed sign, then L2-normalised; a text without words gets the unit vector e0.
* Requests for a model on the workers (classify, tokens) get a fixed placeholder: no model is run.
"""

from __future__ import annotations

import hashlib
import json
import math
import re

EMBEDDING_DIM = 64

PROMPT_TOKEN_RE = re.compile(r"\s*(?:\w+|[^\w\s])|\s+$")
WORD_RE = re.compile(r"\w+")
MARKER_RE = re.compile(r"(?i)\b(?:statements?|claims?|answer|response|actual[ _]output|output|"
                       r"opinions?)\s*:")
SENTENCE_SPLIT_RE = re.compile(r"(?<=[.!?])\s+|\n+")
NUMBER_RE = re.compile(r"\d+(?:[.,]\d+)*")
SECTION_RE = re.compile(r"(?m)^[ \t]*([^\W\d_][^\n:]{0,60}):[ \t]*$")
CONTRADICTION_WORD = "contradict"
BULLET_RE = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)])\s+")
STOP_WORDS = frozenset(
    "the and for are but not you all any can had her was one our out has his how its may new now "
    "old see two who did get let say she too use that with have this will your from they been were "
    "what when where which while there their then than them these those into also only some such "
    "very just over more most other about would could should".split())
VERDICT_NAMES = ("verdict", "attributed", "supported", "relevant", "faithful", "useful", "correct",
                 "agrees", "is_")
SENTENCE_NAMES = ("statement", "claim", "opinion", "truth", "sentence", "text", "question")
BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
YES_NO = {"yes": True, "no": False, "true": True, "false": False, "1": True, "0": False}


# ---------------------------------------------------------------- text rules

def content_words(text: str) -> set[str]:
    """Lower-cased words of 3+ characters (or digits), minus stop words."""
    return {w for w in WORD_RE.findall((text or "").lower())
            if (len(w) >= 3 or w.isdigit()) and w not in STOP_WORDS}


def overlap(text: str, reference_words: set[str]) -> float:
    """Share of the content words of `text` found in the reference; 0 when `text` has none."""
    words = content_words(text)
    return len(words & reference_words) / len(words) if words else 0.0


def sentences(text: str) -> list[str]:
    """A JSON list of strings as it is, else pieces split after . ! ? and at line breaks."""
    stripped = (text or "").strip()
    if stripped.startswith("["):
        try:
            items = json.loads(stripped)
            if isinstance(items, list) and all(isinstance(i, str) for i in items):
                return [i.strip() for i in items if i.strip()]
        except ValueError:
            pass
    pieces = (BULLET_RE.sub("", p).strip() for p in SENTENCE_SPLIT_RE.split(stripped))
    return [p for p in pieces if p]


def message_text(message) -> str:
    """The text of a chat message: string content, or the "text" of its content parts."""
    if not isinstance(message, dict):
        return ""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content
                         if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def last_user_text(messages: list) -> str:
    users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    return message_text(users[-1]) if users else (message_text(messages[-1]) if messages else "")


def prompt_parts(messages: list) -> tuple[str, str, str]:
    """(subject, reference, the case's own reference): the last is the part of the prompt that
    the contradiction rule compares the subject with (the input object's other fields, or the
    last user message before the marker; "" without a marker)."""
    texts = [message_text(m) for m in messages]
    last_user = max((i for i, m in enumerate(messages)
                     if isinstance(m, dict) and m.get("role") == "user"), default=len(texts) - 1)
    last = texts[last_user] if texts else ""
    from_input = split_input_object(last)
    if from_input is not None:
        return from_input + (from_input[1],)
    others = texts[:last_user] + texts[last_user + 1:]
    marks = list(MARKER_RE.finditer(last))
    if marks:
        mark = marks[-1]
        return (last[mark.end():].strip(), "\n".join(others + [last[:mark.start()]]),
                last[:mark.start()])
    return last.strip(), "\n".join(others), ""


def sections(text: str) -> list[tuple[str, str]]:
    """[(label, content)] of the labelled sections of a text ("Question:\n...\n\nAnswer:\n...")."""
    marks = list(SECTION_RE.finditer(text))
    return [(m.group(1).strip(), text[m.end():marks[i + 1].start() if i + 1 < len(marks) else len(text)])
            for i, m in enumerate(marks)]


def reference_sentences(text: str) -> list[str]:
    """The sentences of a reference text, section by section (a section holding a JSON list of
    strings gives its items)."""
    parts = sections(text)
    if not parts:
        return sentences(text)
    return [sentence for _, content in parts for sentence in sentences(content)]


def asks_contradiction(messages: list) -> bool:
    """True when the first sentence of the first message asks about a contradiction."""
    first = message_text(messages[0]) if messages else ""
    pieces = [p for p in SENTENCE_SPLIT_RE.split(first.strip()) if p.strip()]
    return bool(pieces) and CONTRADICTION_WORD in pieces[0].lower()


def _facts(sentence: str) -> tuple[set, dict, set]:
    """(content words other than digits, {name: as written}, numbers) of one sentence. Names are
    the capitalised content words but the sentence's first word; numbers are digit runs with
    . or , inside (a thousands comma dropped)."""
    words = {w for w in content_words(sentence) if not w.isdigit()}
    names = {w.lower(): w for w in WORD_RE.findall(sentence)[1:]
             if w[0].isupper() and w.lower() in words}
    numbers = {n.replace(",", "") for n in NUMBER_RE.findall(sentence)}
    return words, names, numbers


def contradiction(text: str, reference: list[str]) -> tuple[str, str] | None:
    """(what a sentence of `text` says, what a reference sentence says in its place) for the first
    contradiction found (module docstring), else None."""
    for sentence in sentences(text):
        words, names, numbers = _facts(sentence)
        if not words and not numbers:
            continue
        for other in reference:
            other_words, other_names, other_numbers = _facts(other)
            mine = {n for n in names if n not in other_words} | (numbers - other_numbers)
            theirs = {n for n in other_names if n not in words} | (other_numbers - numbers)
            same = (words | numbers) - mine
            if not mine or not theirs or not same or same != (other_words | other_numbers) - theirs:
                continue
            for kind_mine, kind_theirs in ((mine & set(names), theirs & set(other_names)),
                                           (mine & numbers, theirs & other_numbers)):
                if kind_mine and kind_theirs:
                    said = sorted(names.get(x, x) for x in kind_mine)[0]
                    instead = sorted(other_names.get(x, x) for x in kind_theirs)[0]
                    return said, instead
    return None


class Verdicts:
    """How one case is judged: against the reference's content words (overlap), and against the
    case's own reference sentences (contradiction); `contradict` asks the contradiction question."""

    def __init__(self, reference: str, local: str, contradict: bool):
        self.reference_words = content_words(reference)
        self.local = reference_sentences(local) if local.strip() else []
        self.contradict = contradict

    def judge(self, text: str) -> tuple[float, bool, str]:
        """(score in [0, 1], verdict, reason) of a text."""
        found = contradiction(text, self.local) if self.local else None
        if found is not None:
            reason = (f"The text says {found[0]} where the reference says {found[1]}: they "
                      "contradict each other.")
            return 0.0, self.contradict, reason
        score = overlap(text, self.reference_words)
        if self.contradict:
            return score, False, "The text does not contradict the reference."
        return score, score >= 0.5, reason_for(text, score, score >= 0.5)



INPUT_RE = re.compile(r"(?i)\binput\s*:\s*(?=\{)")
TRAILING_OUTPUT_RE = re.compile(r"(?i)^\s*(?:output\s*:)?\s*$")
SUBJECT_FIELDS = ("statements", "claims", "answer", "response", "user_answer", "summary", "text",
                  "sentence", "context")
_DECODER = json.JSONDecoder()


def _field_text(value) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return json.dumps(value)  # sentences() takes a JSON list of strings as it is
    return json.dumps(value, ensure_ascii=False)


def split_input_object(text: str) -> tuple[str, str] | None:
    """(subject, reference) of a prompt ending with `input: {JSON object}` [`Output:`], else None."""
    marks = list(INPUT_RE.finditer(text))
    if not marks:
        return None
    try:
        data, end = _DECODER.raw_decode(text, marks[-1].end())
    except ValueError:
        return None
    if not isinstance(data, dict) or not data or not TRAILING_OUTPUT_RE.match(text[end:]):
        return None
    key = next((k for k in SUBJECT_FIELDS if k in data), list(data)[-1])
    reference = "\n".join(_field_text(v) for k, v in data.items() if k != key)
    return _field_text(data[key]), reference


def schema_in_prompt(messages: list) -> dict | None:
    """The first JSON schema written in the prompt's text: a JSON object with "properties"."""
    for message in messages:
        text = message_text(message)
        i = text.find("{")
        while i != -1:
            try:
                found, end = _DECODER.raw_decode(text, i)
            except ValueError:
                i = text.find("{", i + 1)
                continue
            if isinstance(found, dict) and isinstance(found.get("properties"), dict):
                return found
            # an object that is no schema (an example, the input): skip past all of it
            i = text.find("{", end)
    return None


def reason_for(text: str, score: float, supported: bool) -> str:
    found = "is supported by" if supported else "is not supported by"
    return f"The text {found} the reference ({round(100 * score)}% of its content words appear)."


# ---------------------------------------------------------------- schema walking


class SchemaWriter:
    """Writes a value that validates against a JSON schema, derived from the prompt (rules above)."""

    def __init__(self, root: dict, subject: str, reference: str, request_hash: str,
                 local: str = "", contradict: bool = False, last: str = ""):
        self.root = root
        self.subject = subject
        self.verdicts = Verdicts(reference, local, contradict)
        self.contradict = contradict
        self.sections = sections(last)   # of the last user message, for arrays named after one
        self.request_hash = request_hash

    def resolve(self, schema: dict, depth: int) -> dict:
        """Follow $ref (local #/$defs/... or #/definitions/...) and pick an anyOf/oneOf/allOf branch."""
        for _ in range(32):  # a bound, so a self-referencing schema cannot loop forever
            if not isinstance(schema, dict):
                return {}
            ref = schema.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/"):
                target = self.root
                for part in ref[2:].split("/"):
                    target = target.get(part, {}) if isinstance(target, dict) else {}
                schema = {**{k: v for k, v in schema.items() if k != "$ref"}, **target}
                continue
            for key in ("anyOf", "oneOf", "allOf"):
                branches = schema.get(key)
                if isinstance(branches, list) and branches:
                    usable = [b for b in branches if not (isinstance(b, dict) and b.get("type") == "null")]
                    pick = (usable or branches)[0]
                    schema = {**{k: v for k, v in schema.items() if k != key},
                              **self.resolve(pick, depth)}
                    break
            else:
                return schema
        return schema

    def value(self, schema: dict, name: str, text: str, depth: int = 0,
              verdicts: Verdicts | None = None):
        """A value for `schema` at field `name`, judged on `text` (the subject or one sentence)
        by `verdicts` (default: against the whole prompt's reference)."""
        schema = self.resolve(schema, depth)
        verdicts = verdicts or self.verdicts
        score, supported, reason = verdicts.judge(text)
        if "const" in schema:
            return schema["const"]
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            return self.enum_value(schema["enum"], name, score, supported)
        kind = schema.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "null")
        if kind is None:
            kind = ("object" if "properties" in schema else "array" if "items" in schema
                    else "string")
        if depth > 12:  # a recursive schema: stop with the smallest value of the kind
            return {"object": {}, "array": [], "boolean": False, "null": None,
                    "integer": 0, "number": 0.0}.get(kind, "")
        if kind == "object":
            props = schema.get("properties") or {}
            return {key: self.value(sub, key, text, depth + 1, verdicts) for key, sub in props.items()}
        if kind == "array":
            return self.array_value(schema, name, text, depth, verdicts)
        if kind == "boolean":
            return supported
        if kind == "null":
            return None
        if kind in ("integer", "number"):
            return self.number_value(schema, kind, name, score, supported)
        return self.string_value(schema, name, text, reason, supported)

    def array_value(self, schema: dict, name: str, text: str, depth: int, verdicts) -> list:
        items = sentences(text if depth else self.subject)
        own = self.section_verdicts(name)
        if own is not None:
            items, verdicts = own
        low = int(schema.get("minItems", 0))
        high = int(schema.get("maxItems", max(low, len(items))))
        items = items[:high]
        while len(items) < low:  # pad with the whole text so minItems holds
            items.append(text or "n/a")
        item_schema = schema.get("items") if isinstance(schema.get("items"), dict) else {}
        return [self.value(item_schema, name, item, depth + 1, verdicts) for item in items]

    def section_verdicts(self, name: str):
        """(sentences of the section an array named `<word>_...` is about, Verdicts against the
        other sections), or None (module docstring: labelled sections)."""
        if "_" not in name or len(self.sections) < 2:
            return None
        word = name.split("_", 1)[0].lower()
        for i, (label, content) in enumerate(self.sections):
            if label.split()[0].lower() == word:
                others = "\n".join(f"{lab}:\n{text}" for j, (lab, text) in enumerate(self.sections)
                                   if j != i)
                return sentences(content), Verdicts(others, others, self.contradict)
        return None

    def enum_value(self, options: list, name: str, score: float, supported: bool):
        keys = {str(o).lower(): o for o in options}
        if set(keys) <= set(YES_NO) | {"idk"}:
            for key, truth in YES_NO.items():
                if key in keys and truth == supported:
                    return keys[key]
        if all(isinstance(o, (int, float)) and not isinstance(o, bool) for o in options):
            ordered = sorted(options)
            return ordered[round(score * (len(ordered) - 1))]
        digest = hashlib.sha256(f"{self.request_hash}:{name}".encode()).digest()
        return options[digest[0] % len(options)]

    def number_value(self, schema: dict, kind: str, name: str, score: float, supported: bool):
        low = schema.get("minimum", schema.get("exclusiveMinimum", 0))
        high = schema.get("maximum", schema.get("exclusiveMaximum", max(low, 1)))
        if kind == "integer":
            low = math.ceil(low) + (1 if low == schema.get("exclusiveMinimum") else 0)
            high = math.floor(high) - (1 if high == schema.get("exclusiveMaximum") else 0)
            lname = name.lower()
            if any(v in lname for v in VERDICT_NAMES) and low <= 0 and high >= 1:
                return 1 if supported else 0
            listed = sorted({int(n) for n in re.findall(r"\d+", str(schema.get("description", "")))})
            if len(listed) >= 2 and not any(k in schema for k in BOUNDS):
                return listed[round(score * (len(listed) - 1))]
            return int(min(high, max(low, round(low + score * (high - low)))))
        value = low + score * (high - low)
        # exclusive bounds: move inside by a small step
        span = (high - low) or 1.0
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            value = schema["exclusiveMinimum"] + span * 1e-6
        if "exclusiveMaximum" in schema and value >= schema["exclusiveMaximum"]:
            value = schema["exclusiveMaximum"] - span * 1e-6
        return float(value)

    def string_value(self, schema: dict, name: str, text: str, reason: str, supported: bool) -> str:
        lname = name.lower()
        if lname == "verdict":
            out = "yes" if supported else "no"
        elif any(n in lname for n in SENTENCE_NAMES):
            out = text
        else:
            out = reason
        if "maxLength" in schema:
            out = out[:int(schema["maxLength"])]
        if len(out) < int(schema.get("minLength", 0)):
            out = out + "." * (int(schema["minLength"]) - len(out))
        return out


# ---------------------------------------------------------------- answers

def chat_answer(body: dict, request_hash: str) -> tuple[str, bool]:
    """(content, wants_json) for a valid chat request body (OpenAI's), by the rules in the
    module docstring; request_hash picks among string enum values."""
    fmt = body.get("response_format") or {}
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    messages = body["messages"]
    subject, reference, local = prompt_parts(messages)
    contradict = asks_contradiction(messages)
    verdicts = Verdicts(reference, local, contradict)
    numbers = _allowed_numbers(messages)
    if numbers and kind is None:
        score, _, _ = verdicts.judge(subject)
        return str(numbers[round(score * (len(numbers) - 1))]), False

    def writer(schema):
        return SchemaWriter(schema, subject, reference, request_hash, local, contradict,
                            last_user_text(messages))

    if kind == "json_schema":
        spec = fmt.get("json_schema") or {}
        schema = spec.get("schema") or {}
        return json.dumps(writer(schema).value(schema, spec.get("name", ""), subject)), True
    written = schema_in_prompt(messages) if kind in (None, "json_object") else None
    if written is not None:
        return json.dumps(writer(written).value(written, str(written.get("title", "")), subject)), True
    score, supported, reason = verdicts.judge(subject)
    if kind == "json_object":
        return json.dumps({"verdict": int(supported), "reason": reason}), True
    return f"{1 + round(4 * score)} {reason}", False


NUMBERS_RE = re.compile(r"Reply with only one of these numbers: (\d+(?:, \d+)*)\.\s*$")


def _allowed_numbers(messages: list) -> list[int]:
    """The numbers a prompt allows when its last user message ends with the line
    "Reply with only one of these numbers: a, b, c." (evalbeam's rating templates), else []."""
    users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    match = NUMBERS_RE.search(message_text(users[-1])) if users else None
    return [int(x) for x in match.group(1).split(", ")] if match else []


def embed(text: str, dim: int) -> list[float]:
    """Words hashed into `dim` signed slots, L2-normalised; no words gives the unit vector e0."""
    vector = [0.0] * dim
    for word in WORD_RE.findall((text or "").lower()):
        digest = hashlib.sha256(word.encode()).digest()
        slot = int.from_bytes(digest[:4], "big") % dim
        vector[slot] += 1.0 if digest[4] & 1 else -1.0
    norm = math.sqrt(sum(v * v for v in vector))
    if norm == 0:
        return [1.0] + [0.0] * (dim - 1)
    return [v / norm for v in vector]


def prompt_logprobs(prompt: str) -> dict:
    """{"tokens", "token_logprobs", "text_offset"} of every token of `prompt` under the simulated
    copying bigram model (see the module docstring); the tokens spell the prompt."""
    tokens, values, offsets, seen, previous = [], [], [], set(), ""
    for match in PROMPT_TOKEN_RE.finditer(prompt):
        token = match.group(0)
        word = token.strip().lower()
        if not tokens:
            value = None
        elif word and word in seen:
            value = math.log(0.6)
        else:
            digest = hashlib.sha256((previous + "\x00" + token).encode("utf-8", "surrogatepass")).digest()
            value = math.log(0.01 + 0.29 * int.from_bytes(digest[:4], "big") / 2 ** 32)
        tokens.append(token)
        values.append(value)
        offsets.append(match.start())
        if word:
            seen.add(word)
        previous = token
    return {"tokens": tokens, "token_logprobs": values, "text_offset": offsets}


def simulated_content(request):
    """What a judge would answer to a JudgeRequest by these rules (dry runs): (content, answer
    text). A chat request is answered as the chat body the client would send for it."""
    from evalbeam.transforms.judge.requests import request_hash

    if request.kind == "embedding":
        return embed(request.messages[0][1], EMBEDDING_DIM), ""
    if request.kind == "logprobs":
        return prompt_logprobs(request.messages[0][1]), ""
    if request.kind == "classify":   # a dry run's placeholder: no model is run
        return {"labels": ["LABEL_0"], "probabilities": [0.0]}, ""
    if request.kind == "tokens":
        return {"vectors": [[1.0]], "ids": [0], "special": [False]}, ""
    body = {"model": request.model, "messages": [{"role": r, "content": c} for r, c in request.messages]}
    if request.schema is not None:
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": request.template or "judge",
                                                   "schema": request.schema, "strict": True}}
    text, wants_json = chat_answer(body, request_hash(request))
    return (json.loads(text) if wants_json else text), text
