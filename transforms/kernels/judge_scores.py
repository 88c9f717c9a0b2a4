"""Pure scoring kernels of the LLM-judge and embedding metrics (numpy and the standard library).

Nothing here talks to a judge or an embedding server: transforms/judge/metrics.py asks them and
hands the parsed answers (verdicts, ratings, logprobs, vectors) to these functions. Every score is
a Python float, or None when it cannot be computed; the caller turns None into a status of the
datum (the datum is counted, never averaged). No function returns NaN.

Verdicts
  verdict_of(value)        "yes" / "no" / "idk" when str(value).strip().lower() is one of them (a str
                           only); True -> "yes", False -> "no"; anything else (numbers, None, "Yes!",
                           "maybe") -> None.
  share(verdicts, positive=("yes",), empty=0.0)
                           #{v in positive} / #verdicts. [] -> `empty` (Valor/DeepEval bias,
                           toxicity: 0.0; DeepEval answer relevance: 1.0 with positive=("yes", "idk"),
                           so "idk" counts as relevant). One invalid verdict -> None.
  answer_correctness(answer_verdicts, reference_verdicts, both_empty=1.0)
                           tp = #yes among the answer's statements (supported by the reference),
                           fp = #no among them, fn = #no among the reference's statements (missing
                           from the answer); "idk" counts in none of them.
                           F1 = tp / (tp + (fp + fn) / 2); 0.0 when tp = 0 (Valor), including the
                           case of one empty side; both lists empty -> `both_empty` (RAGAS: 1.0;
                           None -> not computable). An invalid verdict -> None.
  max_over_references(values)
                           max of the values that are not None (nor NaN); None when none is left.
  context_precision(verdicts_per_reference)
                           One row per reference, one verdict per retrieved context in retrieval
                           order. v_k = 1 when some reference says "yes" for context k (an OR over
                           references, Valor), else 0 ("no" and "idk" alike). With
                           precision@k = (v_1 + ... + v_k) / k:
                               score = sum_k precision@k * v_k / sum_k v_k   (0.0 when all v_k = 0)
                           e.g. yes,no,no,yes -> (1 + 2/4) / 2 = 0.75; no,yes,no,yes -> 0.5.
                           No reference or no context -> None; rows of unequal length or an invalid
                           verdict -> None. (RAGAS adds 1e-10 to the denominator; here the all-no
                           case is explicit, so the value is exact.)
  harmonic_mean(values)    n / sum_i (1 / v_i) (RAGAS's combined score). Any None -> None; a
                           negative, NaN or infinite value -> None too (the harmonic mean is meant
                           for scores in [0, 1]); otherwise any 0 -> 0.0 (its limit); [] -> None.

Ratings
  parse_rating(text, allowed)
                           STRICT. Number tokens are found with the pattern
                               optional sign + (digits [. digits] | . digits), ASCII digits only,
                           where a + or - is a sign only when it does not follow a letter or digit
                           ("0-2" is the two tokens 0 and 2; "score-4" is the token 4). The text must
                           hold exactly one distinct numeric value (tokens are compared by value, so
                           "4 ... 4.0" is one value; "2 or 4", "0-2", "4/5" are two -> None); the
                           value must be integral ("4.0" -> 4, "4." -> 4, "2.5" -> None) and in
                           `allowed`. No number, a non-str text -> None. "-0" and "+0" read as 0
                           (the sign of zero means nothing), so they count when 0 is allowed, while
                           "-2" is -2 and is rejected by any non-negative scale. Digits inside a
                           word are tokens too ("H2O scores 4" holds 2 and 4 -> None). This never
                           reads "4.0" as 0 the way RAGAS's legacy scan for the first digit did.
  nv_combine(rating_1, rating_2, scale)
                           NVIDIA's two-template metrics. A rating is valid when it is an int (not a
                           bool) in [0, scale]; each valid one becomes rating / scale. Both valid ->
                           their mean; exactly one valid -> that one (whichever it is: no order
                           dependence, unlike the legacy max(nan, x)); none -> None.
  geval_score(logprobs, allowed=(1, 2, 3, 4, 5), min_mass=0.5, text=None) -> (value, method, mass)
                           G-Eval's expectation. `logprobs` is choices[0].logprobs.content: a list
                           of {"token", "logprob", "top_logprobs": [{"token", "logprob"}, ...]}.
                           The score token is the FIRST entry whose token, stripped of whitespace,
                           is the decimal form of an allowed integer ("4", " 4"; not "04", "4.").
                           Candidates are its top_logprobs (an entry whose exact token text was
                           already seen is ignored); one is kept when its stripped token is an
                           allowed integer and its logprob is a number other than NaN (a logprob
                           above 0, a rounding artefact, counts as 0). The score token itself is
                           added when no kept entry stands for its integer (top_logprobs missing
                           or truncated); when one does, it is not added, whatever its spacing
                           (" 4" chosen, "4" listed). With
                           p(s) = sum of exp(logprob) over the kept candidates of integer s and
                           mass = sum_s p(s):
                               value = sum_s s * p(s) / mass, method "logprobs"
                           e.g. " 4" with top 4: 0.6, 3: 0.3, 5: 0.1 -> 3.8, mass 1.0.
                           When mass < min_mass (or is 0): the score token's own integer, method
                           "integer", with the mass computed. Without logprobs or without a score
                           token: parse_rating(text, allowed), method "integer", mass 0.0. Nothing
                           found -> (None, "none", 0.0). Values are floats ("integer" gives 4.0).

Embeddings and sentences
  cosine(a, b)             a . b / (|a| |b|), clipped to [-1, 1], each sum correctly rounded
                           (math.fsum: the same bits on every CPU). None when either vector is None,
                           not a flat sequence of finite numbers, empty, of zero norm, or when the
                           two lengths differ.
  split_sentences(text)    Split at every line break (str.splitlines) and, within a line, after
                           . ! or ? followed by whitespace; strip the pieces; drop those without a
                           letter or digit (str.isalnum on some character). A stop needs whitespace
                           after it to split, so "3.5", "example.com" and "x.y" stay whole, while
                           "e.g. this" splits after "e.g.". Deterministic, no model (no nltk).
                           A non-str text -> [].
  In the functions below a cosine that is None is skipped inside a max, min or mean; an aggregate
  over nothing but None is None.
  answer_similarity(response_vec, reference_vecs)
                           max over references r of cos(response, r) (RAGAS / H2O answer
                           similarity); no reference -> None.
  sentence_relevancy(query_vec, sentence_vecs)
                           max over the answer's sentences s of cos(query, s) (H2O answer relevancy,
                           sentence similarity); no sentence -> None.
  groundedness(answer_sentence_vecs, context_sentence_vecs)
                           min over answer sentences a of max over all context sentences c of
                           cos(a, c) (H2O groundedness); no answer sentence or no context
                           sentence -> None. An answer sentence whose cosines are all None is left
                           out of the min.
  context_relevancy(query_vec, chunk_sentence_vecs) -> (recall, precision)
                           chunk_rel(ch) = max over the chunk's sentences s of cos(query, s);
                           recall = max over chunks, precision = mean over chunks (H2O soft recall
                           and precision). A chunk without sentences (or with no computable
                           cosine) is left out; no chunk left -> (None, None).
  answer_correctness_blend(f1, similarity, weights=(0.75, 0.25))
                           (w1 f1 + w2 similarity) / (w1 + w2) (RAGAS: 0.75 / 0.25). A part with
                           weight 0 is not needed, so (1, 0) gives f1 even when similarity is None;
                           a needed part that is None -> None. Negative weights or a zero sum raise
                           ValueError (a configuration error, not a property of the datum).
"""

from __future__ import annotations

import math
import re
from numbers import Integral, Real

import numpy as np

VERDICTS = ("yes", "no", "idk")


# ---------------------------------------------------------------------------------------------
# Verdicts

def verdict_of(value) -> str | None:
    """The normal form of one judge verdict ("yes", "no", "idk"), or None when it is not one."""
    if isinstance(value, (bool, np.bool_)):
        return "yes" if bool(value) else "no"
    if isinstance(value, str):
        normal = value.strip().lower()
        if normal in VERDICTS:
            return normal
    return None


def _normal_verdicts(verdicts) -> list[str] | None:
    """Every verdict normalised, or None when the input is not a list or one verdict is invalid."""
    if not isinstance(verdicts, (list, tuple)):
        return None
    out = [verdict_of(v) for v in verdicts]
    return None if any(v is None for v in out) else out


def share(verdicts: list, positive=("yes",), empty: float | None = 0.0) -> float | None:
    """Share of verdicts in `positive`; `empty` for no verdict; None for an invalid verdict."""
    normal = _normal_verdicts(verdicts)
    if normal is None:
        return None
    if not normal:
        return None if empty is None else float(empty)
    return sum(1 for v in normal if v in positive) / len(normal)


def answer_correctness(answer_verdicts: list, reference_verdicts: list,
                       both_empty: float | None = 1.0) -> float | None:
    """Statement-level F1 of an answer against one reference (Valor / RAGAS)."""
    answer = _normal_verdicts(answer_verdicts)
    reference = _normal_verdicts(reference_verdicts)
    if answer is None or reference is None:
        return None
    if not answer and not reference:
        return None if both_empty is None else float(both_empty)
    tp = answer.count("yes")
    fp = answer.count("no")
    fn = reference.count("no")
    if tp == 0:
        return 0.0
    return tp / (tp + 0.5 * (fp + fn))


def _is_number(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, (bool, np.bool_))


def max_over_references(values: list) -> float | None:
    """Max of the computable values (None and NaN are skipped); None when nothing is left."""
    kept = [float(v) for v in values if _is_number(v) and not math.isnan(v)]
    return max(kept) if kept else None


def context_precision(verdicts_per_reference: list) -> float | None:
    """Average precision of the retrieved contexts, a context being useful for any reference."""
    if not isinstance(verdicts_per_reference, (list, tuple)) or not verdicts_per_reference:
        return None
    rows = [_normal_verdicts(row) for row in verdicts_per_reference]
    if any(row is None for row in rows):
        return None
    width = len(rows[0])
    if width == 0 or any(len(row) != width for row in rows):
        return None
    useful = [any(row[k] == "yes" for row in rows) for k in range(width)]
    total = sum(useful)
    if total == 0:
        return 0.0
    terms, seen = [], 0
    for k, hit in enumerate(useful, start=1):
        if hit:
            seen += 1
            terms.append(seen / k)
    return math.fsum(terms) / total


def harmonic_mean(values: list) -> float | None:
    """n / sum(1 / v): None if a value is missing or invalid, 0.0 if a value is 0."""
    if not values or any(v is None for v in values):
        return None
    if any(not _is_number(v) or not math.isfinite(v) or v < 0 for v in values):
        return None
    if any(v == 0 for v in values):
        return 0.0
    return len(values) / math.fsum(1.0 / float(v) for v in values)


# ---------------------------------------------------------------------------------------------
# Ratings

_NUMBER = re.compile(r"(?:(?<![0-9A-Za-z])[-+])?(?:[0-9]+(?:\.[0-9]+)?|\.[0-9]+)")


def parse_rating(text, allowed: tuple) -> int | None:
    """The one integer rating written in `text`, if it is in `allowed`; else None (strict)."""
    if not isinstance(text, str):
        return None
    values = {float(token) for token in _NUMBER.findall(text)}
    if len(values) != 1:
        return None
    value = values.pop()
    if not value.is_integer():
        return None
    rating = int(value)
    return rating if rating in allowed else None


def _valid_rating(rating, scale: int) -> bool:
    return (isinstance(rating, Integral) and not isinstance(rating, (bool, np.bool_))
            and 0 <= rating <= scale)


def nv_combine(rating_1: int | None, rating_2: int | None, scale: int) -> float | None:
    """Mean of the valid ratings scaled to [0, 1]; the single valid one; None if neither is."""
    if scale <= 0:
        raise ValueError(f"scale must be positive, got {scale!r}")
    valid = [int(r) / scale for r in (rating_1, rating_2) if _valid_rating(r, scale)]
    if not valid:
        return None
    return math.fsum(valid) / len(valid)


def _entry(item) -> tuple[str, float] | None:
    """(token, logprob) of one logprobs entry, or None when it is malformed or NaN."""
    if not isinstance(item, dict):
        return None
    token, logprob = item.get("token"), item.get("logprob")
    if not isinstance(token, str) or not _is_number(logprob) or math.isnan(logprob):
        return None
    return token, float(logprob)


def geval_score(logprobs: list | None, allowed=(1, 2, 3, 4, 5), min_mass: float = 0.5,
                text: str | None = None) -> tuple[float | None, str, float]:
    """G-Eval: (expected score, "logprobs", mass), else ("integer") fallbacks, else (None, "none", 0.0)."""
    by_text = {str(int(a)): int(a) for a in allowed}
    score_index = None
    if isinstance(logprobs, (list, tuple)):
        for index, item in enumerate(logprobs):
            token = item.get("token") if isinstance(item, dict) else None
            if isinstance(token, str) and token.strip() in by_text:
                score_index = index
                break
    if score_index is None:
        rating = parse_rating(text, tuple(by_text.values()))
        return (float(rating), "integer", 0.0) if rating is not None else (None, "none", 0.0)

    item = logprobs[score_index]
    token = item["token"]
    candidates: dict[str, float] = {}
    top = item.get("top_logprobs")
    for alternative in top if isinstance(top, (list, tuple)) else ():
        entry = _entry(alternative)
        if entry is not None and entry[0] not in candidates:
            candidates[entry[0]] = entry[1]
    probability: dict[int, float] = {}
    for candidate, logprob in candidates.items():
        score = by_text.get(candidate.strip())
        if score is not None:
            probability[score] = probability.get(score, 0.0) + math.exp(min(logprob, 0.0))
    own = _entry(item)
    chosen = by_text[token.strip()]
    if own is not None and chosen not in probability:
        probability[chosen] = math.exp(min(own[1], 0.0))
    mass = math.fsum(probability.values())
    if mass <= 0.0 or mass < min_mass:
        return float(chosen), "integer", mass
    value = math.fsum(s * p for s, p in probability.items()) / mass
    return value, "logprobs", mass


# ---------------------------------------------------------------------------------------------
# Embeddings and sentences

def _vector(value) -> np.ndarray | None:
    if value is None:
        return None
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        return None
    if array.ndim != 1 or array.size == 0 or not np.all(np.isfinite(array)):
        return None
    return array


def cosine(a, b) -> float | None:
    """Cosine similarity clipped to [-1, 1]; None for a zero, missing or malformed vector.

    The three sums (a . b, |a|^2, |b|^2) are correctly rounded (math.fsum over the elementwise
    products, which IEEE arithmetic gives the same on every CPU): numpy's dot and norm add in
    an order that depends on the CPU's vector width, so an AVX-512 machine and an AVX2 one
    gave scores that differed in the last bit."""
    x, y = _vector(a), _vector(b)
    if x is None or y is None or x.shape != y.shape:
        return None
    norm = math.sqrt(math.fsum((x * x).tolist())) * math.sqrt(math.fsum((y * y).tolist()))
    if norm == 0.0 or not math.isfinite(norm):
        return None
    return min(1.0, max(-1.0, math.fsum((x * y).tolist()) / norm))


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def split_sentences(text: str) -> list[str]:
    """Sentences of a text: split at line breaks and after . ! ? followed by whitespace."""
    if not isinstance(text, str):
        return []
    out = []
    for line in text.splitlines():
        for piece in _SENTENCE_END.split(line):
            piece = piece.strip()
            if any(ch.isalnum() for ch in piece):
                out.append(piece)
    return out


def _seq(vectors):
    """A list (or array) of vectors as it is; None as no vector."""
    return () if vectors is None else vectors


def _best(values) -> float | None:
    kept = [v for v in values if v is not None]
    return max(kept) if kept else None


def answer_similarity(response_vec, reference_vecs: list) -> float | None:
    """Max over references of cos(response, reference)."""
    return _best(cosine(response_vec, r) for r in _seq(reference_vecs))


def sentence_relevancy(query_vec, sentence_vecs: list) -> float | None:
    """Max over the answer's sentences of cos(query, sentence)."""
    return _best(cosine(query_vec, s) for s in _seq(sentence_vecs))


def groundedness(answer_sentence_vecs: list, context_sentence_vecs: list) -> float | None:
    """Min over answer sentences of their best cosine with any context sentence."""
    answers, contexts = _seq(answer_sentence_vecs), _seq(context_sentence_vecs)
    if len(answers) == 0 or len(contexts) == 0:
        return None
    best = [_best(cosine(a, c) for c in contexts) for a in answers]
    kept = [v for v in best if v is not None]
    return min(kept) if kept else None


def context_relevancy(query_vec, chunk_sentence_vecs: list) -> tuple[float | None, float | None]:
    """(recall, precision) = (max, mean) over chunks of the chunk's best sentence cosine."""
    per_chunk = [_best(cosine(query_vec, s) for s in _seq(chunk)) for chunk in _seq(chunk_sentence_vecs)]
    kept = [v for v in per_chunk if v is not None]
    if not kept:
        return None, None
    return max(kept), math.fsum(kept) / len(kept)


def answer_correctness_blend(f1: float | None, similarity: float | None,
                             weights=(0.75, 0.25)) -> float | None:
    """Weighted average of the F1 and the similarity; a part with weight 0 may be None."""
    w1, w2 = (float(w) for w in weights)
    if w1 < 0 or w2 < 0 or w1 + w2 <= 0 or not math.isfinite(w1 + w2):
        raise ValueError(f"weights must be non-negative with a positive sum, got {weights!r}")
    parts = [(w, float(v) if v is not None else None) for w, v in ((w1, f1), (w2, similarity)) if w > 0]
    if any(v is None or math.isnan(v) for _, v in parts):
        return None
    if len(parts) == 1:
        return parts[0][1]
    return (w1 * parts[0][1] + w2 * parts[1][1]) / (w1 + w2)
