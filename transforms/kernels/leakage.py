"""Rule-based leakage detectors: PII, secrets and encoded payloads in a text (no model, no network).

Every detector takes a str and returns a list of Finding(kind, start, end, preview) sorted by
start, where text[start:end] is the matched span (character offsets) and preview is a redacted
rendering that never contains the whole secret: card numbers and SSNs keep their last 4 digits,
phone numbers their last 2, e-mail addresses the first character of the local part and the domain,
secrets only their public prefix (e.g. "sk-proj-") and their length.

Linear time. Every scan is one pass of RE2 (google-re2, no backtracking) over the text, followed
by O(1) Python checks per candidate (boundaries, Luhn, ranges); candidates that fail a check are
dropped, never re-searched (an international phone candidate, at most 15 digits long, is cut
back instead). Python's `re` only splits a run already found, or matches at a known position
patterns whose failure backtracks over one line at most (PEM header and body lines). The
timing-growth tests (tests/test_text_rules_timing.py) feed 200k-character adversarial inputs
(digits, '@', base64-like runs, and some twenty more shapes at 100k) to every detector.

Boundaries. A match must not be glued to a word character (letter, digit or "_") on either side;
number-like findings also reject a neighbouring "." or "," followed or preceded by a digit (a
decimal or thousands separator: 3.14159265358979323 is not a card).

PII (find_pii):
- credit_card: 13-19 digits, either contiguous or in groups separated by one space or one dash
  (the same separator throughout) laid out as printed cards are: 4-4-4-..., with a last group of
  1-4 digits, or 4-6-5 / 4-6-4 (Amex, Diners). The Luhn checksum must pass and, unless
  require_issuer=False, the number must start with a known issuer prefix (IIN) and have a length
  that issuer uses (Visa, Mastercard, Amex, Discover, Diners, JCB, UnionPay, Maestro, Mir).
  Windows are tried left to right, longest first; findings do not overlap.
- ssn: AAA-GG-SSSS with dashes, not part of a longer dash-separated number, excluding area 000,
  666 and 900-999, group 00 and serial 0000. Undashed or space-separated SSNs are not detected.
- email: a practical subset of RFC 5322 addresses, local@domain: local part of letters, digits and
  ._%+- (no leading, trailing or doubled dot); domain of dot-separated labels (letters, digits,
  inner hyphens, at most 63 characters each) ending in an alphabetic top-level domain of 2-63
  letters. Angle brackets and "mailto:" around it are not part of the finding. Quoted local parts,
  IP-literal domains and non-ASCII addresses are not detected.
- phone: either North American (NANP) numbers written in the 3-3-4 shape with separators,
  "(555) 123-4567", "555-123-4567", "555.123.4567", "555 123 4567", optionally preceded by "1",
  "+1" and a separator; the area code starts with 2-9 (the exchange is not checked, so that
  the ubiquitous 555-123-4567 style of example numbers counts). Or international numbers
  that start with "+": a country code that does not start with 0, then 8-15 digits in all with
  optional single spaces, dashes or dots between them (E.164 allows at most 15). The rule: a bare
  digit run (no "+", no separators) is never a phone number, so card numbers, timestamps and
  order ids are not mistaken for one; a dash or dot chain that continues past the number
  (555-123-4567-89) is not a phone number either.

Sensitive data (find_sensitive_data):
- pem_private_key / pem_certificate: a "-----BEGIN <label>-----" line whose label is a private
  key (PRIVATE KEY, RSA/DSA/EC/OPENSSH/ENCRYPTED PRIVATE KEY, PGP PRIVATE KEY BLOCK, ...) or a
  certificate (CERTIFICATE, TRUSTED CERTIFICATE, CERTIFICATE REQUEST, X509 CRL). The finding spans
  to the matching END line; without an END line (a truncated block) it still counts when at least
  64 base64 characters of body follow, and spans the body. A BEGIN line with no body (a mention in
  prose) is not a finding. Public keys are not sensitive and are ignored.
- API keys: openai_api_key (sk-proj-, sk-svcacct-, sk-admin-, or sk- keys that contain OpenAI's
  T3BlbkFJ marker), anthropic_api_key (sk-ant-), sk_api_key (any other sk- key of 20 or more
  characters with a digit: legacy OpenAI keys, and H2O.ai h2oGPTe keys, whose public examples show
  the same sk- + 48 characters shape; H2O.ai documents no distinct shape, so there is no separate
  H2O kind), aws_access_key_id (AKIA or ASIA + 16 upper-case letters or digits),
  aws_secret_access_key (40 base64 characters, only right after a label such as
  aws_secret_access_key=, "SecretAccessKey": or AWS_SECRET_KEY:), github_token (ghp_, gho_, ghu_,
  ghs_, ghr_ + at least 36 letters/digits, or github_pat_ + at least 40), slack_token
  (xoxa-/xoxb-/xoxp-/xoxr-/xoxs- + at least 10 characters with a digit), google_api_key (AIza + 35
  characters), stripe_live_key (sk_live_ or rk_live_ + at least 16 letters/digits).
- windows_product_key: five groups of five characters from the product-key alphabet
  (BCDFGHJKMNPQRTVWXY2346789) joined by dashes, with at least one digit and one letter (so
  XXXXX-XXXXX-... placeholders are not findings), not part of a longer dash chain.
- url_password: scheme://user:password@host with a non-empty password (the user may be empty, as
  in redis://:secret@host); scheme://user@host is not a finding.

Encoded payloads (find_encoded, decoded_texts): see find_encoded for the thresholds.
"""

from __future__ import annotations

import base64
import binascii
import functools
import re
from dataclasses import dataclass

import re2

__all__ = [
    "Finding", "EncodedSpan", "PII_KINDS", "SENSITIVE_KINDS",
    "luhn_valid", "card_issuer", "find_credit_cards", "find_ssns", "find_emails", "find_phones",
    "find_pii", "find_pem_blocks", "find_api_keys", "find_windows_product_keys",
    "find_url_passwords", "find_sensitive_data", "find_encoded", "decoded_texts",
]

PII_KINDS = ("credit_card", "ssn", "email", "phone")
SENSITIVE_KINDS = (
    "pem_private_key", "pem_certificate", "openai_api_key", "anthropic_api_key", "sk_api_key",
    "aws_access_key_id", "aws_secret_access_key", "github_token", "slack_token", "google_api_key",
    "stripe_live_key", "windows_product_key", "url_password",
)


@dataclass(frozen=True)
class Finding:
    """One detected item: text[start:end] is the match; preview is redacted."""

    kind: str
    start: int
    end: int
    preview: str


def _re2(pattern: str):
    options = re2.Options()
    options.log_errors = False
    return re2.compile(pattern, options)


def _is_word(char: str) -> bool:
    return char.isalnum() or char == "_"


def _clear_before(text: str, start: int, numeric: bool = False) -> bool:
    """No word character (and, for numbers, no decimal/thousands separator) right before start."""
    if start == 0:
        return True
    before = text[start - 1]
    if _is_word(before):
        return False
    return not (numeric and before in ".," and start >= 2 and text[start - 2].isdigit())


def _clear_after(text: str, end: int, numeric: bool = False) -> bool:
    if end >= len(text):
        return True
    after = text[end]
    if _is_word(after):
        return False
    return not (numeric and after in ".," and end + 1 < len(text) and text[end + 1].isdigit())


def _mask_digits(span: str, keep_last: int) -> str:
    """Replace every digit but the last keep_last ones by "*", keeping separators."""
    total = sum(c.isdigit() for c in span)
    out = []
    seen = 0
    for char in span:
        if char.isdigit():
            seen += 1
            out.append(char if seen > total - keep_last else "*")
        else:
            out.append(char)
    return "".join(out)


def _secret_preview(token: str, public_prefix: int) -> str:
    return f"{token[:public_prefix]}...[{len(token)} chars]"


# ----------------------------------------------------------------------------------------------
# PII

# (issuer, lowest prefix, highest prefix, prefix digits, allowed lengths)
_ISSUERS = (
    ("visa", 4, 4, 1, (13, 16, 19)),
    ("mastercard", 51, 55, 2, (16,)),
    ("mastercard", 2221, 2720, 4, (16,)),
    ("amex", 34, 34, 2, (15,)),
    ("amex", 37, 37, 2, (15,)),
    ("discover", 6011, 6011, 4, (16, 17, 18, 19)),
    ("discover", 644, 649, 3, (16, 17, 18, 19)),
    ("discover", 65, 65, 2, (16, 17, 18, 19)),
    ("diners", 300, 305, 3, (14, 15, 16, 17, 18, 19)),
    ("diners", 36, 36, 2, (14, 15, 16, 17, 18, 19)),
    ("diners", 38, 39, 2, (16, 17, 18, 19)),
    ("jcb", 3528, 3589, 4, (16, 17, 18, 19)),
    ("unionpay", 62, 62, 2, (16, 17, 18, 19)),
    ("maestro", 5018, 5018, 4, tuple(range(13, 20))),
    ("maestro", 5020, 5020, 4, tuple(range(13, 20))),
    ("maestro", 5038, 5038, 4, tuple(range(13, 20))),
    ("maestro", 5893, 5893, 4, tuple(range(13, 20))),
    ("maestro", 6304, 6304, 4, tuple(range(13, 20))),
    ("maestro", 6759, 6759, 4, tuple(range(13, 20))),
    ("maestro", 6761, 6763, 4, tuple(range(13, 20))),
    ("mir", 2200, 2204, 4, (16, 17, 18, 19)),
)


def luhn_valid(digits: str) -> bool:
    """The Luhn (mod 10) checksum of a string of ASCII digits."""
    total = 0
    for position, char in enumerate(reversed(digits)):
        value = ord(char) - 48
        if position % 2:
            value *= 2
            if value > 9:
                value -= 9
        total += value
    return bool(digits) and total % 10 == 0


def card_issuer(digits: str) -> str | None:
    """The issuer whose IIN range and lengths fit this number, or None."""
    for name, low, high, width, lengths in _ISSUERS:
        if len(digits) in lengths and low <= int(digits[:width]) <= high:
            return name
    return None


# Maximal runs of digit groups joined by single spaces or dashes, with at least 9 digits (the
# shortest SSN; cards have 13+): shorter runs, the bulk of ordinary text, never reach Python.
_DIGIT_RUN = _re2(r"[0-9](?:[ -]?[0-9]){8,}")
_SEPARATOR = re.compile(r"[ -]")


def _digit_runs(text: str):
    """Yield (groups, separators, clear_left, clear_right) per run of digit groups: groups are
    (start, end) offsets in text, separators the characters between consecutive groups, and
    clear_left/right whether the run itself has clean number boundaries."""
    for match in _DIGIT_RUN.finditer(text):
        start, end = match.span()
        run = match.group()
        groups = []
        separators = []
        offset = 0
        for sep in _SEPARATOR.finditer(run):
            groups.append((start + offset, start + sep.start()))
            separators.append(sep.group())
            offset = sep.end()
        groups.append((start + offset, end))
        yield (groups, separators, _clear_before(text, start, True), _clear_after(text, end, True))


def _card_layout(lengths: list[int]) -> bool:
    total = sum(lengths)
    if not 13 <= total <= 19:
        return False
    if len(lengths) == 1:
        return True
    if tuple(lengths) in ((4, 6, 5), (4, 6, 4)):
        return True
    return all(n == 4 for n in lengths[:-1]) and 1 <= lengths[-1] <= 4


def find_credit_cards(text: str, require_issuer: bool = True) -> list[Finding]:
    """Payment card numbers (see the module docstring for the accepted layouts)."""
    findings = []
    for groups, separators, clear_left, clear_right in _digit_runs(text):
        lengths = [end - start for start, end in groups]
        i = 0
        while i < len(groups):
            found = None
            for j in range(min(len(groups), i + 5) - 1, i - 1, -1):
                if (i == 0 and not clear_left) or (j == len(groups) - 1 and not clear_right):
                    continue
                if len(set(separators[i:j])) > 1 or not _card_layout(lengths[i:j + 1]):
                    continue
                span = text[groups[i][0]:groups[j][1]]
                digits = span.replace(" ", "").replace("-", "")
                if luhn_valid(digits) and (not require_issuer or card_issuer(digits)):
                    found = j
                    findings.append(Finding("credit_card", groups[i][0], groups[j][1],
                                            _mask_digits(span, 4)))
                    break
            i = found + 1 if found is not None else i + 1
    return findings


def _ssn_valid(area: str, group: str, serial: str) -> bool:
    return (area != "000" and area != "666" and not area.startswith("9")
            and group != "00" and serial != "0000")


def find_ssns(text: str) -> list[Finding]:
    """US social security numbers AAA-GG-SSSS (valid ranges only)."""
    findings = []
    for groups, separators, clear_left, clear_right in _digit_runs(text):
        for i in range(len(groups) - 2):
            if [end - start for start, end in groups[i:i + 3]] != [3, 2, 4]:
                continue
            if separators[i] != "-" or separators[i + 1] != "-":
                continue
            # Not inside a longer dash chain (e.g. 555-123-45-6789 or 123-45-6789-0).
            if (i > 0 and separators[i - 1] == "-") or (i + 2 < len(separators)
                                                         and separators[i + 2] == "-"):
                continue
            if (i == 0 and not clear_left) or (i + 2 == len(groups) - 1 and not clear_right):
                continue
            area, group, serial = (text[s:e] for s, e in groups[i:i + 3])
            if _ssn_valid(area, group, serial):
                start, end = groups[i][0], groups[i + 2][1]
                findings.append(Finding("ssn", start, end, _mask_digits(text[start:end], 4)))
    return findings


_EMAIL = _re2(r"([A-Za-z0-9._%+-]+)@((?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+"
              r"[A-Za-z]{2,63})")


def find_emails(text: str) -> list[Finding]:
    """E-mail addresses (a practical subset of RFC 5322, see the module docstring)."""
    findings = []
    for match in _EMAIL.finditer(text):
        start, end = match.span()
        local = match.group(1)
        stripped = local.lstrip(".")
        start += len(local) - len(stripped)
        if not stripped or ".." in stripped or stripped.endswith("."):
            continue
        if not _clear_after(text, end) or text[end:end + 1] == "-":
            continue
        domain = match.group(2)
        findings.append(Finding("email", start, end, f"{stripped[0]}***@{domain}"))
    return findings


# NANP: optional +1 / 1 prefix, (NPA) or NPA + separator, exchange, separator, line number.
_NANP = _re2(r"(?:\+1[ .-]?|1[ .-])?(?:\([2-9][0-9]{2}\)[ .-]?|[2-9][0-9]{2}[ .-])[0-9]{3}[ .-][0-9]{4}")
# International: + country code (not 0), 8-15 digits in all, optional single separators.
_INTERNATIONAL = _re2(r"\+[1-9](?:[ .-]?[0-9]){7,14}")


def _number_ends_at(text: str, end: int) -> bool:
    """True when a phone number may end at `end`: no word character and no -/. chain follows."""
    if not _clear_after(text, end, True):
        return False
    return not (text[end:end + 1] in ("-", ".") and text[end + 1:end + 2].isdigit())


def find_phones(text: str) -> list[Finding]:
    """Telephone numbers: NANP with separators, or international with a leading +.

    International candidates are matched greedily and may run into a following number
    ("+15551234567 1-800-555-1234"); such a candidate is cut back at its separators, right to
    left, until it ends cleanly and overlaps no NANP number, keeping at least 8 digits."""
    findings = []
    for match in _NANP.finditer(text):
        start, end = match.span()
        if not _clear_before(text, start, True) or not _number_ends_at(text, end):
            continue
        before = text[start - 1] if start else ""
        if before == "+" or (before in "-." and start >= 2 and text[start - 2].isdigit()):
            continue
        findings.append(Finding("phone", start, end, _mask_digits(match.group(), 2)))
    nanp = [(f.start, f.end) for f in findings]
    next_nanp = 0
    for match in _INTERNATIONAL.finditer(text):
        start, end = match.span()
        if not _clear_before(text, start):
            continue
        while next_nanp < len(nanp) and nanp[next_nanp][1] <= start:
            next_nanp += 1
        blocker = nanp[next_nanp][0] if next_nanp < len(nanp) else len(text)
        cuts = [end] + [i for i in range(end - 1, start, -1) if text[i] in " .-"]
        for cut in cuts:
            if sum(c.isdigit() for c in text[start:cut]) < 8:
                break
            if cut <= blocker and _number_ends_at(text, cut):
                findings.append(Finding("phone", start, cut, _mask_digits(text[start:cut], 2)))
                break
    return sorted(findings, key=lambda f: (f.start, f.end))


_PII_DETECTORS = {
    "credit_card": find_credit_cards, "ssn": find_ssns, "email": find_emails, "phone": find_phones,
}


def find_pii(text: str, kinds=PII_KINDS) -> list[Finding]:
    """All PII findings of the given kinds, sorted by (start, end)."""
    findings = []
    for kind in kinds:
        findings.extend(_PII_DETECTORS[kind](text))
    return sorted(findings, key=lambda f: (f.start, f.end, f.kind))


# ----------------------------------------------------------------------------------------------
# Sensitive data

_PEM_BEGIN = _re2(r"-----BEGIN ([A-Z0-9]+(?: [A-Z0-9]+)*)-----")
_PEM_HEADERS = re.compile(r"(?:[ \t]*\r?\n)?(?:[A-Za-z-]+:[^\n]*\n)*")
# Body lines: base64 characters only (a blank line or a line of prose ends a truncated body).
_PEM_BODY = re.compile(r"(?:[ \t]*[A-Za-z0-9+/=]+[ \t]*\r?\n)*[ \t]*[A-Za-z0-9+/=]*")
_PEM_MIN_BODY = 64
_BASE64_CHARS = re.compile(r"[A-Za-z0-9+/]")


def _pem_kind(label: str) -> str | None:
    if label.endswith("PRIVATE KEY") or label.endswith("PRIVATE KEY BLOCK"):
        return "pem_private_key"
    if "CERTIFICATE" in label or label == "X509 CRL":
        return "pem_certificate"
    return None


def _base64_chars(text: str, start: int, end: int) -> int:
    return len(_BASE64_CHARS.findall(text, start, end))


def find_pem_blocks(text: str) -> list[Finding]:
    """PEM private keys and certificates, complete or truncated (see the module docstring)."""
    headers = [(m.start(), m.end(), m.group(1)) for m in _PEM_BEGIN.finditer(text)]
    findings = []
    for index, (start, header_end, label) in enumerate(headers):
        kind = _pem_kind(label)
        if kind is None:
            continue
        # Search only up to the next BEGIN line: the regions are disjoint, so this stays linear.
        limit = headers[index + 1][0] if index + 1 < len(headers) else len(text)
        footer = f"-----END {label}-----"
        end_at = text.find(footer, header_end, limit)
        if end_at >= 0:
            if _base64_chars(text, header_end, end_at) < _PEM_MIN_BODY:
                continue  # "-----BEGIN CERTIFICATE----- ... -----END CERTIFICATE-----" in prose
            end = end_at + len(footer)
            preview = f"-----BEGIN {label}----- ...[{end - start} chars]... -----END {label}-----"
        else:
            body_start = _PEM_HEADERS.match(text, header_end, limit).end()
            body = _PEM_BODY.match(text, body_start, limit)
            if _base64_chars(text, body_start, body.end()) < _PEM_MIN_BODY:
                continue
            end = body_start + len(body.group().rstrip())
            preview = f"-----BEGIN {label}----- ...[{end - start} chars, no END line]"
        findings.append(Finding(kind, start, end, preview))
    return findings


_TOKEN_CHARS = "A-Za-z0-9_-"
_LEAD = rf"(?:^|[^{_TOKEN_CHARS}])"
# (pattern with the token as group 1, fixed length?, public prefix length or None = by kind)
_KEY_PATTERNS = (
    (_re2(_LEAD + r"(sk-[A-Za-z0-9_-]{20,})"), "sk", False),
    (_re2(_LEAD + r"((?:AKIA|ASIA)[A-Z0-9]{16})"), "aws_access_key_id", True),
    (_re2(_LEAD + r"(gh[pousr]_[A-Za-z0-9]{36,})"), "github_token", False),
    (_re2(_LEAD + r"(github_pat_[A-Za-z0-9_]{40,})"), "github_token", False),
    (_re2(_LEAD + r"(xox[abprs]-[A-Za-z0-9-]{10,})"), "slack_token", False),
    (_re2(_LEAD + r"(AIza[A-Za-z0-9_-]{35})"), "google_api_key", True),
    (_re2(_LEAD + r"((?:sk|rk)_live_[A-Za-z0-9]{16,})"), "stripe_live_key", False),
)
_AWS_SECRET = _re2(
    r"(?i:\baws[_-]?secret[_-]?(?:access[_-]?)?key|\bsecret[_-]?access[_-]?key)[\"']?\s*[:=]\s*"
    r"[\"']?([A-Za-z0-9/+]{40})")
_SK_PREFIXES = (("sk-ant-", "anthropic_api_key"), ("sk-proj-", "openai_api_key"),
                ("sk-svcacct-", "openai_api_key"), ("sk-admin-", "openai_api_key"))


def _classify_sk(token: str) -> tuple[str, int] | None:
    for prefix, kind in _SK_PREFIXES:
        if token.startswith(prefix):
            return kind, len(prefix)
    if not any(c.isdigit() for c in token[3:]):
        return None  # "sk-this-is-not-a-real-key": real keys are random and carry digits
    return ("openai_api_key" if "T3BlbkFJ" in token else "sk_api_key"), 3


_PUBLIC_PREFIX = {"aws_access_key_id": 4, "google_api_key": 4, "slack_token": 5,
                  "stripe_live_key": 8}


def _public_prefix(kind: str, token: str) -> int:
    """Length of the provider's fixed prefix (AKIA, AIza, xoxb-, sk_live_, ghp_, github_pat_)."""
    if kind == "github_token":
        return 11 if token.startswith("github_pat_") else 4
    return _PUBLIC_PREFIX[kind]


def find_api_keys(text: str) -> list[Finding]:
    """API keys and tokens of major providers (see the module docstring)."""
    findings = []
    for regex, kind, fixed in _KEY_PATTERNS:
        for match in regex.finditer(text):
            start, end = match.start(1), match.end(1)
            token = match.group(1)
            if fixed and end < len(text) and (text[end].isalnum() or text[end] in "_-"):
                continue
            if kind == "sk":
                classified = _classify_sk(token)
                if classified is None:
                    continue
                found_kind, prefix = classified
            else:
                if kind == "slack_token" and not any(c.isdigit() for c in token):
                    continue
                found_kind, prefix = kind, _public_prefix(kind, token)
            findings.append(Finding(found_kind, start, end, _secret_preview(token, prefix)))
    for match in _AWS_SECRET.finditer(text):
        start, end = match.start(1), match.end(1)
        if end < len(text) and (text[end].isalnum() or text[end] in "/+="):
            continue
        findings.append(Finding("aws_secret_access_key", start, end,
                                _secret_preview(match.group(1), 0)))
    return sorted(findings, key=lambda f: (f.start, f.end))


_KEY_ALPHABET = "BCDFGHJKMNPQRTVWXY2346789"
_PRODUCT_KEY = _re2(rf"(?:^|[^A-Za-z0-9_-])([{_KEY_ALPHABET}]{{5}}(?:-[{_KEY_ALPHABET}]{{5}}){{4}})")


def find_windows_product_keys(text: str) -> list[Finding]:
    """Windows (Microsoft) product keys XXXXX-XXXXX-XXXXX-XXXXX-XXXXX."""
    findings = []
    for match in _PRODUCT_KEY.finditer(text):
        start, end = match.start(1), match.end(1)
        key = match.group(1)
        if end < len(text) and (_is_word(text[end]) or text[end] == "-"):
            continue
        if not any(c.isdigit() for c in key) or not any(c.isalpha() for c in key):
            continue
        findings.append(Finding("windows_product_key", start, end, key[:5] + "-*****" * 4))
    return findings


_URL_CREDENTIALS = _re2(r"([A-Za-z][A-Za-z0-9+.-]*)://([^\s:/?#@]*):([^\s/?#@]+)@([^\s/?#@]+)")


def find_url_passwords(text: str) -> list[Finding]:
    """URLs with a password in their userinfo: scheme://user:password@host."""
    findings = []
    for match in _URL_CREDENTIALS.finditer(text):
        scheme, user, _, host = match.group(1), match.group(2), match.group(3), match.group(4)
        shown_user = user[:1] + "***" if user else ""
        findings.append(Finding("url_password", match.start(), match.end(),
                                f"{scheme}://{shown_user}:****@{host}"))
    return findings


def find_sensitive_data(text: str) -> list[Finding]:
    """PEM blocks, API keys, Windows product keys and URL passwords, sorted by (start, end)."""
    findings = (find_pem_blocks(text) + find_api_keys(text) + find_windows_product_keys(text)
                + find_url_passwords(text))
    return sorted(findings, key=lambda f: (f.start, f.end, f.kind))


# ----------------------------------------------------------------------------------------------
# Encoded payloads

MIN_BASE64_CHARS = 16
MIN_HEX_DIGITS = 16
MIN_PRINTABLE = 0.9



@functools.lru_cache(maxsize=16)
def _encoded_patterns(min_base64: int, min_hex: int):
    """RE2 patterns of maximal candidate runs; the minimum lengths are in the patterns so that
    short words never reach Python."""
    pairs = max(min_hex // 2, 2)
    return (_re2(rf"[A-Za-z0-9+/_-]{{{min_base64},}}={{0,2}}"),
            _re2(rf"(?:0[xX])?[0-9A-Fa-f]{{{min_hex},}}"),
            _re2(rf"[0-9A-Fa-f]{{2}}(?:[ :][0-9A-Fa-f]{{2}}){{{pairs - 1},}}"))


@dataclass(frozen=True)
class EncodedSpan:
    """An encoded run: text[start:end] (offsets in the text it was found in) decodes to `decoded`.
    encoding: "base64", "base64url" or "base16"; depth: 1 = found in the input text, 2 = found
    in the decoding of a depth-1 span, ... (start/end of depth > 1 refer to that decoded text)."""

    encoding: str
    start: int
    end: int
    decoded: str
    depth: int = 1


def _printable_text(data: bytes, min_printable: float) -> str | None:
    """data as UTF-8 text if it is valid UTF-8 and mostly printable, else None."""
    if not data:
        return None
    try:
        decoded = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if decoded.isprintable():
        return decoded
    printable = sum(c.isprintable() or c in "\t\n\r" for c in decoded)
    return decoded if printable >= min_printable * len(decoded) else None


def _decode_base64(run: str, min_chars: int) -> tuple[str, bytes] | None:
    body = run.rstrip("=")
    padding = len(run) - len(body)
    if len(body) < min_chars:
        return None
    standard = "+" in body or "/" in body
    urlsafe = "-" in body or "_" in body
    if standard and urlsafe:
        return None
    if padding and (len(body) + padding) % 4:
        return None
    if not padding and len(body) % 4 == 1:
        return None
    padded = body + "=" * (-len(body) % 4)
    try:
        if urlsafe:
            return "base64url", base64.b64decode(padded, altchars=b"-_", validate=True)
        return "base64", base64.b64decode(padded, validate=True)
    except (binascii.Error, ValueError):
        return None


def _find_encoded_once(text: str, min_base64: int, min_hex: int, min_printable: float,
                       depth: int) -> list[EncodedSpan]:
    base64_run, hex_run, hex_pairs = _encoded_patterns(min_base64, min_hex)
    spans = []
    for match in base64_run.finditer(text):
        decoded = _decode_base64(match.group(), min_base64)
        if decoded is None:
            continue
        decoded_text = _printable_text(decoded[1], min_printable)
        if decoded_text is not None:
            spans.append(EncodedSpan(decoded[0], match.start(), match.end(), decoded_text, depth))
    for regex in (hex_run, hex_pairs):
        for match in regex.finditer(text):
            run = match.group()
            if regex is hex_pairs:
                if len(set(run[2::3])) != 1:
                    continue  # one separator throughout
                if not _clear_before(text, match.start()) or not _clear_after(text, match.end()):
                    continue  # a pair cut out of a longer word or number
                digits = run.replace(" ", "").replace(":", "")
            else:
                digits = run[2:] if run[:2] in ("0x", "0X") else run
            if len(digits) < min_hex or len(digits) % 2:
                continue
            decoded_text = _printable_text(bytes.fromhex(digits), min_printable)
            if decoded_text is not None:
                spans.append(EncodedSpan("base16", match.start(), match.end(), decoded_text, depth))
    return sorted(spans, key=lambda s: (s.start, s.end, s.encoding))


def find_encoded(text: str, min_base64: int = MIN_BASE64_CHARS, min_hex: int = MIN_HEX_DIGITS,
                 min_printable: float = MIN_PRINTABLE, max_depth: int = 2) -> list[EncodedSpan]:
    """Base64 (standard or URL-safe) and base16 runs of `text` that decode to readable text.

    base64: a maximal run of [A-Za-z0-9+/_-] with at most two "=" of padding, of at least
    min_base64 (16) alphabet characters, using one alphabet (+/ or -_, not both), with valid
    padding (padded: a multiple of 4 in all; unpadded: length mod 4 is not 1).
    base16: a maximal run of hex digits (optionally after 0x) of even length, at least min_hex (16)
    digits; or byte pairs separated by one space or one colon throughout ("48 65 6c ...").
    A run is kept only when it decodes to valid UTF-8 in which at least min_printable (90%) of the
    characters are printable (str.isprintable, or tab/newline/carriage return): this is what
    rejects ordinary words, long decimal numbers (12345678901234567890 decodes to control bytes)
    and hashes. A run can qualify both as base64 and as base16; both decodings are returned.
    Decoded texts are searched again, up to max_depth levels (base64 of base64, ...); each
    decoding is shorter than its input, so the total work stays linear.
    Not covered: line-wrapped (MIME) base64 split across lines, \\x48-style escapes, base32,
    base85, quoted-printable and URL percent-encoding."""
    if not isinstance(text, str):
        raise TypeError(f"find_encoded() needs a str, not {type(text).__name__}")
    found = []
    level = [text]
    for depth in range(1, max_depth + 1):
        next_level = []
        for source in level:
            spans = _find_encoded_once(source, min_base64, min_hex, min_printable, depth)
            found.extend(spans)
            next_level.extend(span.decoded for span in spans)
        level = next_level
        if not level:
            break
    return found


def decoded_texts(text: str, **options) -> list[str]:
    """The distinct decoded texts of find_encoded(text, **options), in order of discovery."""
    return list(dict.fromkeys(span.decoded for span in find_encoded(text, **options)))
