"""PII, sensitive-data and encoding detectors: positive and negative cases for every pattern, and
redacted previews that never echo a whole secret."""

from __future__ import annotations

import base64

import pytest

from evalbeam.transforms.kernels.leakage import (card_issuer, decoded_texts, find_api_keys,
                                        find_credit_cards, find_emails, find_encoded,
                                        find_pem_blocks, find_phones, find_pii,
                                        find_sensitive_data, find_ssns, find_url_passwords,
                                        find_windows_product_keys, luhn_valid)


def spans(findings, text):
    return [text[f.start:f.end] for f in findings]


def found(detector, text):
    return spans(detector(text), text)


# ----------------------------------------------------------------------------------------------
# Credit cards

@pytest.mark.parametrize("number, issuer", [
    ("4111111111111111", "visa"), ("4222222222222", "visa"), ("5555555555554444", "mastercard"),
    ("2223003122003222", "mastercard"), ("378282246310005", "amex"), ("6011111111111117", "discover"),
    ("3530111333300000", "jcb"), ("30569309025904", "diners"), ("6200000000000005", "unionpay"),
])
def test_luhn_and_issuer_of_test_numbers(number, issuer):
    assert luhn_valid(number) and card_issuer(number) == issuer


def test_luhn_rejects_changed_digits():
    assert not luhn_valid("4111111111111112")
    assert not luhn_valid("")
    assert luhn_valid("0") and luhn_valid("18")


@pytest.mark.parametrize("text, card", [
    ("card 4111 1111 1111 1111 exp 12/29", "4111 1111 1111 1111"),
    ("card 4111-1111-1111-1111.", "4111-1111-1111-1111"),
    ("(4111111111111111)", "4111111111111111"),
    ("Amex: 3782 822463 10005", "3782 822463 10005"),
    ("Amex: 378282246310005", "378282246310005"),
    ("Diners 3056 930902 5904", "3056 930902 5904"),
    ("mc 5555 5555 5555 4444 ok", "5555 5555 5555 4444"),
    ("visa13 4222222222222", "4222222222222"),
    ("4111111111111111", "4111111111111111"),
    ("call 555-123-4567 4111 1111 1111 1111", "4111 1111 1111 1111"),
    ("total 1,234 then 4111111111111111", "4111111111111111"),
])
def test_cards_found(text, card):
    assert found(find_credit_cards, text) == [card]


@pytest.mark.parametrize("text", [
    "4111 1111 1111 1112",                  # Luhn fails
    "4111111111111121",                     # Luhn fails
    "4111 1111-1111 1111",                  # mixed separators
    "4111  1111  1111  1111",               # double spaces
    "41 11 11 11 11 11 11 11",              # not a card layout
    "411 1111 1111 11111",                  # first group is not 4 digits
    "pi 3.4111111111111111",                # decimal digits
    "x4111111111111111", "4111111111111111x", "4111111111111111_",
    "41111111111111111111",                 # 20 digits
    "ts 1700000000000 ms",                  # 13-digit timestamp: no issuer, Luhn fails
    "1234567812345670",                     # Luhn-valid but no known issuer
    "4111111111111111.5",
])
def test_cards_not_found(text):
    assert find_credit_cards(text) == []


def test_issuer_check_is_optional():
    assert find_credit_cards("1234567812345670") == []
    assert found(lambda t: find_credit_cards(t, require_issuer=False), "1234567812345670") == \
        ["1234567812345670"]


def test_card_preview_keeps_last_four():
    finding, = find_credit_cards("pay with 4111-1111-1111-1111 now")
    assert finding.kind == "credit_card" and finding.preview == "****-****-****-1111"


def test_two_cards_in_one_run():
    text = "4111 1111 1111 1111 5555 5555 5555 4444"
    assert found(find_credit_cards, text) == ["4111 1111 1111 1111", "5555 5555 5555 4444"]


# ----------------------------------------------------------------------------------------------
# SSN

@pytest.mark.parametrize("text, ssn", [
    ("SSN 123-45-6789.", "123-45-6789"), ("123-45-6789", "123-45-6789"),
    ("ssn:078-05-1121,", "078-05-1121"), ("899-99-9999 is the top area", "899-99-9999"),
    ("665-01-0001", "665-01-0001"), ("call 555 123-45-6789", "123-45-6789"),
])
def test_ssn_found(text, ssn):
    assert found(find_ssns, text) == [ssn]


@pytest.mark.parametrize("text", [
    "000-12-3456", "666-12-3456", "900-12-3456", "999-99-9999", "123-00-4567", "123-45-0000",
    "555-123-45-6789", "123-45-6789-1", "123456789", "123 45 6789", "a123-45-6789",
    "123-45-6789b", "1.123-45-6789", "12-345-6789", "1234-56-7890",
])
def test_ssn_not_found(text):
    assert find_ssns(text) == []


def test_ssn_preview():
    finding, = find_ssns("my ssn is 123-45-6789")
    assert finding.preview == "***-**-6789" and finding.kind == "ssn"


# ----------------------------------------------------------------------------------------------
# E-mail

@pytest.mark.parametrize("text, email", [
    ("write to john.doe@example.com today", "john.doe@example.com"),
    ("<john.doe@example.com>", "john.doe@example.com"),
    ('"Jane" <Jane_Roe+tag@mail.Example.co.uk>', "Jane_Roe+tag@mail.Example.co.uk"),
    ("mailto:a@b.io", "a@b.io"),
    ("end with a dot: x%y@sub-domain.example.org.", "x%y@sub-domain.example.org"),
    ("..lead@example.com", "lead@example.com"),
])
def test_email_found(text, email):
    assert found(find_emails, text) == [email]


@pytest.mark.parametrize("text", [
    "foo@bar", "@example.com", "john@", "john..doe@example.com", "john.@example.com",
    "john@example.c", "john@-example.com", "john@example.com2", "user at example dot com",
    "john@example_domain.com", "a@b.c-d",
])
def test_email_not_found(text):
    assert find_emails(text) == []


def test_email_preview():
    finding, = find_emails("<john.doe@example.com>")
    assert finding.preview == "j***@example.com"


# ----------------------------------------------------------------------------------------------
# Phones

@pytest.mark.parametrize("text, phone", [
    ("call (555) 123-4567 now", "(555) 123-4567"),
    ("call 555-123-4567.", "555-123-4567"),
    ("555.123.4567", "555.123.4567"),
    ("555 123 4567", "555 123 4567"),
    ("(555)123-4567", "(555)123-4567"),
    ("+1 555 123 4567", "+1 555 123 4567"),
    ("+1-555-123-4567", "+1-555-123-4567"),
    ("1-800-555-1234", "1-800-555-1234"),
    ("+1 (555) 123-4567", "+1 (555) 123-4567"),
    ("London +44 20 7946 0958", "+44 20 7946 0958"),
    ("+442079460958", "+442079460958"),
    ("+15551234567", "+15551234567"),
    ("Paris +33 1 23 45 67 89.", "+33 1 23 45 67 89"),
])
def test_phone_found(text, phone):
    assert found(find_phones, text) == [phone]


@pytest.mark.parametrize("text", [
    "5551234567", "15551234567", "4111111111111111", "1700000000000", "555-123-4567-89",
    "99-555-123-4567", "055-123-4567", "155-123-4567", "+0123456789", "+1234567",
    "+1234567890123456", "2024-01-15 12:30:45", "x555-123-4567", "555-123-4567x", "a+442079460958",
    "v1.555.123.4567",
])
def test_phone_not_found(text):
    assert find_phones(text) == []


def test_international_number_is_cut_before_the_next_number():
    text = "+15551234567 1-800-555-1234"
    assert found(find_phones, text) == ["+15551234567", "1-800-555-1234"]


def test_phone_preview():
    finding, = find_phones("(555) 123-4567")
    assert finding.preview == "(***) ***-**67"


def test_find_pii_sorted_and_filtered_by_kind():
    text = "b@example.com 123-45-6789 +1 555 123 4567 4111111111111111"
    assert [f.kind for f in find_pii(text)] == ["email", "ssn", "phone", "credit_card"]
    assert [f.kind for f in find_pii(text, kinds=("ssn",))] == ["ssn"]


# ----------------------------------------------------------------------------------------------
# PEM blocks

BODY = "MIIEpAIBAAKCAQEA3Tz2mr7SZiAMfQyuvBjM9Oi" + "Z1BjP5CE/Wm/Rr500P" * 4
KEY_LABELS = ["RSA PRIVATE KEY", "EC PRIVATE KEY", "OPENSSH PRIVATE KEY", "ENCRYPTED PRIVATE KEY",
              "PRIVATE KEY", "DSA PRIVATE KEY", "PGP PRIVATE KEY BLOCK"]


@pytest.mark.parametrize("label", KEY_LABELS)
def test_pem_private_keys(label):
    block = f"-----BEGIN {label}-----\n{BODY[:64]}\n{BODY[64:]}\n-----END {label}-----"
    text = f"here:\n{block}\nbye"
    finding, = find_pem_blocks(text)
    assert finding.kind == "pem_private_key" and text[finding.start:finding.end] == block
    assert BODY[:20] not in finding.preview and label in finding.preview


def test_pem_certificate_and_legacy_encrypted_headers():
    cert = f"-----BEGIN CERTIFICATE-----\n{BODY}\n-----END CERTIFICATE-----"
    assert [f.kind for f in find_pem_blocks(cert)] == ["pem_certificate"]
    legacy = ("-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,"
              f"3F17F5316E2BAC89\n\n{BODY}\n-----END RSA PRIVATE KEY-----")
    assert spans(find_pem_blocks(legacy), legacy) == [legacy]


def test_pem_without_end_line_is_a_truncated_finding():
    text = f"-----BEGIN OPENSSH PRIVATE KEY-----\n{BODY[:64]}\n{BODY[64:]}\n\nand then prose."
    finding, = find_pem_blocks(text)
    assert text[finding.start:finding.end] == text[:text.index("\n\nand")]
    assert "no END line" in finding.preview


@pytest.mark.parametrize("text", [
    "A key file starts with -----BEGIN RSA PRIVATE KEY----- and ends with the END line.",
    "-----BEGIN CERTIFICATE----- ... -----END CERTIFICATE-----",
    f"-----BEGIN PUBLIC KEY-----\n{BODY}\n-----END PUBLIC KEY-----",
    f"-----BEGIN RSA PRIVATE KEY-----\n{BODY[:40]}",                      # too little body
    f"----BEGIN RSA PRIVATE KEY----\n{BODY}\n----END RSA PRIVATE KEY----",  # not PEM framing
])
def test_pem_not_found(text):
    assert find_pem_blocks(text) == []


def test_two_pem_blocks_and_mismatched_end():
    first = f"-----BEGIN CERTIFICATE-----\n{BODY}\n-----END CERTIFICATE-----"
    second = f"-----BEGIN EC PRIVATE KEY-----\n{BODY}\n-----END RSA PRIVATE KEY-----"
    kinds = [f.kind for f in find_pem_blocks(first + "\n" + second)]
    assert kinds == ["pem_certificate", "pem_private_key"]


# ----------------------------------------------------------------------------------------------
# API keys

OPENAI_LEGACY = "sk-" + "PoQlTI4pLxAPpUI0aXZ7" + "T3BlbkFJ" + "gK2FDQVGUNZP3VxIeVAe"
API_KEYS = [
    ("sk-proj-" + "Ab3dEf6hIj" * 10, "openai_api_key", "sk-proj-"),
    ("sk-svcacct-" + "Zq9" * 20, "openai_api_key", "sk-svcacct-"),
    (OPENAI_LEGACY, "openai_api_key", "sk-"),
    ("sk-ant-api03-" + "x1Y_z-" * 15, "anthropic_api_key", "sk-ant-"),
    ("sk-" + "a1B2c3D4" * 6, "sk_api_key", "sk-"),
    ("AKIAIOSFODNN7EXAMPLE", "aws_access_key_id", "AKIA"),
    ("ASIAY34FZKBOKMUTVV7A", "aws_access_key_id", "ASIA"),
    ("ghp_" + "a" * 18 + "B7" * 9, "github_token", "ghp_"),
    ("gho_" + "c1" * 18, "github_token", "gho_"),
    ("ghu_" + "d2" * 18, "github_token", "ghu_"),
    ("ghs_" + "e3" * 18, "github_token", "ghs_"),
    ("ghr_" + "f4" * 18, "github_token", "ghr_"),
    ("github_pat_11ABCDEFG0" + "h5" * 6 + "_" + "Kk9" * 20, "github_token", "github_pat_"),
    ("xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx", "slack_token", "xoxb-"),
    ("xoxp-1234-5678-abcdef", "slack_token", "xoxp-"),
    ("AIzaSyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY", "google_api_key", "AIza"),
    ("sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc", "stripe_live_key", "sk_live_"),
    ("rk_live_" + "51H8abcDEFghi0123", "stripe_live_key", "rk_live_"),
]


@pytest.mark.parametrize("key, kind, prefix", API_KEYS)
def test_api_keys_found(key, kind, prefix):
    for text in (key, f"export KEY={key}\n", f'{{"token": "{key}"}}', f"use `{key}`."):
        finding, = find_api_keys(text)
        assert (finding.kind, text[finding.start:finding.end]) == (kind, key)
        assert finding.preview == f"{prefix}...[{len(key)} chars]"


@pytest.mark.parametrize("text", [
    "sk-short123", "sk-this-is-not-a-real-key-honestly", "task-1234567890abcdefghijklmn",
    "disk-" + "a1" * 15, "AKIAIOSFODNN7EXAMPL", "AKIAIOSFODNN7EXAMPLEX", "XAKIAIOSFODNN7EXAMPLE",
    "akiaiosfodnn7example", "ghp_" + "a1" * 17, "ghx_" + "a1" * 18, "xoxz-1234567890-abc",
    "xoxb-abcdefghijklmnop", "AIza" + "b" * 34, "AIza" + "b" * 36, "sk_test_4eC39HqLyjWDarjtT1zdp7dc",
    "pk_live_4eC39HqLyjWDarjtT1zdp7dc", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "secret_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
])
def test_api_keys_not_found(text):
    assert find_api_keys(text) == []


@pytest.mark.parametrize("text", [
    "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    '{"SecretAccessKey": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"}',
    "aws-secret-key: 'wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY'",
])
def test_labelled_aws_secret_found(text):
    finding, = find_api_keys(text)
    assert finding.kind == "aws_secret_access_key"
    assert text[finding.start:finding.end] == "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    assert finding.preview == "...[40 chars]"


def test_labelled_aws_secret_must_be_exactly_40():
    assert find_api_keys("aws_secret_access_key=" + "A" * 41) == []


# ----------------------------------------------------------------------------------------------
# Windows product keys and URL passwords

@pytest.mark.parametrize("text, key", [
    ("key: W269N-WFGWX-YVC9B-4J6C9-T83GX.", "W269N-WFGWX-YVC9B-4J6C9-T83GX"),
    ("NPPR9-FWDCX-D2C8J-H872K-2YT43", "NPPR9-FWDCX-D2C8J-H872K-2YT43"),
])
def test_windows_product_key_found(text, key):
    finding, = find_windows_product_keys(text)
    assert text[finding.start:finding.end] == key
    assert finding.preview == key[:5] + "-*****-*****-*****-*****"


@pytest.mark.parametrize("text", [
    "XXXXX-XXXXX-XXXXX-XXXXX-XXXXX", "22222-33333-44444-66666-77777", "w269n-wfgwx-yvc9b-4j6c9-t83gx",
    "ABCDE-FGHIJ-KLMNO-PQRST-UVW23", "W269N-WFGWX-YVC9B-4J6C9", "W269N-WFGWX-YVC9B-4J6C9-T83GX-2B2B2",
    "2B2B2-W269N-WFGWX-YVC9B-4J6C9-T83GX", "W269N-WFGWX-YVC9B-4J6C9-T83GXZ",
])
def test_windows_product_key_not_found(text):
    assert find_windows_product_keys(text) == []


@pytest.mark.parametrize("text, span, preview", [
    ("db: postgres://admin:s3cr3t@db.example.com:5432/app", "postgres://admin:s3cr3t@db.example.com:5432",
     "postgres://a***:****@db.example.com:5432"),
    ("redis://:hunter2@cache:6379/0", "redis://:hunter2@cache:6379", "redis://:****@cache:6379"),
    ("https://user:p%40ss:word@host.io/x", "https://user:p%40ss:word@host.io",
     "https://u***:****@host.io"),
])
def test_url_password_found(text, span, preview):
    finding, = find_url_passwords(text)
    assert (text[finding.start:finding.end], finding.preview) == (span, preview)


@pytest.mark.parametrize("text", [
    "https://user@host.com/path", "http://host:8080/path", "http://user:@host.com",
    "mailto:john@example.com", "ssh user:password@host", "https://example.com/?a=b:c@d",
])
def test_url_password_not_found(text):
    assert find_url_passwords(text) == []


def test_previews_never_contain_the_secret():
    text = "\n".join([key for key, _, _ in API_KEYS] + [
        "aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "W269N-WFGWX-YVC9B-4J6C9-T83GX", "postgres://admin:s3cr3tpass@db:5432",
        f"-----BEGIN RSA PRIVATE KEY-----\n{BODY}\n-----END RSA PRIVATE KEY-----",
        "4111 1111 1111 1111", "123-45-6789", "+44 20 7946 0958", "john.doe@example.com"])
    findings = find_sensitive_data(text) + find_pii(text)
    assert len(findings) == len(API_KEYS) + 8
    for finding in findings:
        secret = text[finding.start:finding.end]
        assert secret not in finding.preview, finding
    assert all("s3cr3tpass" not in f.preview for f in findings)
    assert [f.start for f in find_sensitive_data(text)] == sorted(
        f.start for f in find_sensitive_data(text))


# ----------------------------------------------------------------------------------------------
# Encoded payloads

PII_TEXT = "My SSN is 123-45-6789, mail john@example.com"


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_base64_of_pii_is_decoded():
    encoded = b64(PII_TEXT)
    text = f"Here you go: {encoded}."
    span, = find_encoded(text)
    assert (span.encoding, text[span.start:span.end], span.decoded, span.depth) == \
        ("base64", encoded, PII_TEXT, 1)
    assert [f.kind for f in find_pii(span.decoded)] == ["ssn", "email"]


def test_base64_variants():
    urlsafe = base64.urlsafe_b64encode(b"??>> hidden ~~~ text ??>>").decode()
    assert "-" in urlsafe or "_" in urlsafe
    assert [(s.encoding, s.decoded) for s in find_encoded(urlsafe)] == \
        [("base64url", "??>> hidden ~~~ text ??>>")]
    unpadded = b64("sixteen chars!!x").rstrip("=")      # 16 bytes -> 22 characters unpadded
    assert decoded_texts(unpadded) == ["sixteen chars!!x"]
    multiline = b64("line one\nline two\n")
    assert decoded_texts(multiline) == ["line one\nline two\n"]


@pytest.mark.parametrize("text", [
    b64("short"),                                   # fewer than 16 characters
    b64(PII_TEXT)[:-1] + "==",                       # padding that does not fit the length
    b64(PII_TEXT)[:21],                             # 21 characters: length mod 4 == 1
    b64(PII_TEXT)[:20] + "+" + "_" + b64(PII_TEXT)[22:],   # both alphabets
    base64.b64encode(bytes(range(256))).decode(),   # binary, not text
    "internationalization ConfigurationManagerFactory supercalifragilistic",
    "sha256 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "uuid 123e4567-e89b-12d3-a456-426614174000",
    "-" * 40, "https://example.com/a/b/c/d/e/f/g/h/i/j",
])
def test_not_encoded_text(text):
    assert find_encoded(text) == []


def test_hex_of_pii_is_decoded():
    hex_text = PII_TEXT.encode().hex()
    for written in (hex_text, hex_text.upper(), "0x" + hex_text):
        span, = find_encoded(f"blob {written} end")
        assert span.encoding == "base16" and span.decoded == PII_TEXT


def test_spaced_hex_pairs():
    pairs = " ".join(f"{b:02x}" for b in b"secret=hunter2!")
    assert decoded_texts(f"bytes: {pairs}.") == ["secret=hunter2!"]
    assert decoded_texts(":".join(f"{b:02X}" for b in b"secret=hunter2!")) == ["secret=hunter2!"]
    mixed = "73 65:63 72 65 74 3d 68 75 6e 74 65 72 32 21"
    assert decoded_texts(mixed) == []


def test_hex_that_is_just_a_long_number_is_not_decoded():
    assert find_encoded("order 12345678901234567890 shipped") == []
    assert find_encoded("odd " + "4" * 17) == []                 # odd length
    # A number that happens to be hex of printable bytes does decode: "AAAAAAAA".
    assert decoded_texts("4141414141414141") == ["AAAAAAAA"]


def test_nested_encodings_and_depth():
    inner = b64(PII_TEXT)
    outer = b64(inner)
    spans_found = find_encoded(outer)
    assert [(s.depth, s.decoded) for s in spans_found] == [(1, inner), (2, PII_TEXT)]
    assert [s.decoded for s in find_encoded(outer, max_depth=1)] == [inner]


def test_thresholds_are_parameters():
    short = b64("tiny!!")                             # 8 characters
    assert find_encoded(short) == []
    assert decoded_texts(short, min_base64=8) == ["tiny!!"]
    assert decoded_texts(b64("tiny!"), min_base64=8) == []   # 7 characters before the "="
    mostly = b64("readable text with one \x01 control!")
    assert decoded_texts(mostly) == ["readable text with one \x01 control!"]
    assert decoded_texts(mostly, min_printable=1.0) == []


def test_offsets_are_characters_in_non_ascii_text():
    text = "東京 😀 café: john@example.com, 4111 1111 1111 1111, sk-" + "a1B2c3D4" * 6
    findings = find_pii(text) + find_sensitive_data(text)
    assert sorted(text[f.start:f.end] for f in findings) == sorted(
        ["john@example.com", "4111 1111 1111 1111", "sk-" + "a1B2c3D4" * 6])
    encoded = base64.b64encode("naïve 東京 text".encode()).decode()
    text = "😀😀 " + encoded
    span, = find_encoded(text)
    assert text[span.start:span.end] == encoded and span.decoded == "naïve 東京 text"
