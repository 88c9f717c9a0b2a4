"""The Text Matching condition language: operands, operators, precedence, escapes, errors, and a
randomized comparison with Python's own boolean operators as the oracle."""

from __future__ import annotations

import pickle
import random
import re

import pytest

from evalbeam.transforms.kernels.conditions import Condition, ConditionError, parse_condition


def matches(condition: str, text: str) -> bool:
    return parse_condition(condition).matches(text)


# The documented examples of the reference evaluator.
@pytest.mark.parametrize("condition, text, expected", [
    ('"15,969"', "Brazil revenue was 15,969 million", True),
    ('"15,969"', "Brazil revenue was 15969 million", False),
    ('regexp("15,?969")', "Brazil revenue was 15969 million", True),
    ('regexp("15,?969")', "Brazil revenue was 15.969 million", False),
    ('"15,969" AND regexp("[Mm]illion")', "15,969 Million", True),
    ('"15,969" AND regexp("[Mm]illion")', "15,969 billion", False),
    ('("Brazil" OR "brazil") AND regexp("15,?969 [Mm]illion") AND NOT "Real"',
     "brazil: 15969 million", True),
    ('("Brazil" OR "brazil") AND regexp("15,?969 [Mm]illion") AND NOT "Real"',
     "Brazil: 15,969 million Real", False),
    ('("Brazil" OR "brazil") AND regexp("15,?969 [Mm]illion") AND NOT "Real"',
     "BRAZIL: 15,969 million", False),
    ('regexp("^Brazil revenue was 15,969 million$")', "Brazil revenue was 15,969 million", True),
    ('regexp("^Brazil revenue was 15,969 million$")', "Brazil revenue was 15,969 million.", False),
    # The documentation's "^$Brazil" typo can never match: ^$ only matches an empty text.
    ('regexp("^$Brazil revenue was 15,969 million$")', "Brazil revenue was 15,969 million", False),
])
def test_documented_examples(condition, text, expected):
    assert matches(condition, text) is expected


class TestStringOperand:
    def test_case_sensitive_substring_anywhere(self):
        assert matches('"cat"', "concatenate")
        assert not matches('"Cat"', "concatenate")
        assert not matches('"cat"', "")

    def test_empty_string_occurs_everywhere(self):
        assert matches('""', "")
        assert matches('""', "anything")
        assert not matches('NOT ""', "anything")

    def test_escaped_quote_and_backslash(self):
        assert matches(r'"say \"hi\""', 'they say "hi" twice')
        assert not matches(r'"say \"hi\""', "they say hi twice")
        assert matches(r'"back\\slash"', "a back\\slash here")
        assert not matches(r'"back\\slash"', "a back\\\\slash here")

    def test_other_backslash_pairs_are_kept(self):
        # "\n" in a string literal is a backslash and an n, not a newline.
        assert matches(r'"a\nb"', "a\\nb")
        assert not matches(r'"a\nb"', "a\nb")

    def test_unicode(self):
        assert matches('"café 東京"', "un café 東京 😀")
        assert not matches('"cafe"', "café")

    def test_whitespace_between_tokens(self):
        assert matches('\t"a"\n AND\n\t"b"  ', "ab")


class TestRegexpOperand:
    def test_search_not_fullmatch(self):
        assert matches(r'regexp("\d{3}")', "code 123 here")
        assert not matches(r'regexp("\d{4}")', "code 123 here")

    def test_escapes_in_patterns(self):
        # \d stays \d; \\. is a backslash-dot in the pattern, i.e. a literal dot.
        assert matches(r'regexp("a\\.b")', "a.b")
        assert not matches(r'regexp("a\\.b")', "axb")
        assert matches(r'regexp("a\.b")', "a.b")           # kept as written: same pattern
        assert matches(r'regexp("say \"hi\"")', 'say "hi"')

    def test_anchors_are_whole_text_unless_multiline(self):
        assert not matches('regexp("^b")', "a\nb")
        assert matches('regexp("(?m)^b$")', "a\nb\nc")

    def test_dot_is_one_character_of_utf8_text(self):
        assert matches('regexp("^.$")', "é")
        assert matches('regexp("^..$")', "東京")
        assert matches('regexp("caf.")', "café")

    def test_case_insensitive_flag(self):
        assert matches('regexp("(?i)brazil")', "BRAZIL")

    def test_same_pattern_twice_is_one_operand(self):
        condition = parse_condition('regexp("a+") AND (regexp("a+") OR "x") AND "x"')
        assert condition.operands == (("regexp", "a+"), ("string", "x"))
        assert condition.matches("aax") and not condition.matches("aa")


class TestOperators:
    @pytest.mark.parametrize("condition, text, expected", [
        ('"a" AND "b"', "ab", True), ('"a" AND "b"', "a", False), ('"a" AND "b"', "b", False),
        ('"a" OR "b"', "a", True), ('"a" OR "b"', "b", True), ('"a" OR "b"', "c", False),
        ('NOT "a"', "b", True), ('NOT "a"', "a", False),
        ('NOT NOT "a"', "a", True), ('NOT NOT NOT "a"', "a", False),
    ])
    def test_truth_tables(self, condition, text, expected):
        assert matches(condition, text) is expected

    def test_and_binds_tighter_than_or(self):
        # "a" OR ("b" AND "c")
        assert matches('"a" OR "b" AND "c"', "a")
        assert not matches('"a" OR "b" AND "c"', "b")
        assert matches('"b" AND "c" OR "a"', "a")
        # parentheses override it
        assert not matches('("a" OR "b") AND "c"', "a")

    def test_not_binds_tighter_than_and(self):
        # (NOT "a") AND "b"
        assert matches('NOT "a" AND "b"', "b")
        assert not matches('NOT "a" AND "b"', "ab")
        assert not matches('NOT "a" AND "b"', "")
        # NOT ("a" AND "b")
        assert matches('NOT ("a" AND "b")', "")

    def test_nested_not_and_parentheses(self):
        condition = '(("a")) AND NOT (NOT ("b" OR NOT "c") AND (NOT NOT "d"))'
        for text in ["", "a", "ab", "ac", "ad", "abd", "acd", "abcd", "bcd"]:
            a, b, c, d = ("a" in text), ("b" in text), ("c" in text), ("d" in text)
            assert matches(condition, text) is (a and not ((not (b or not c)) and d)), text

    def test_short_circuit_does_not_change_results(self):
        condition = parse_condition('"x" OR regexp("y") AND NOT regexp("z")')
        assert [condition.matches(t) for t in ["x", "y", "yz", "xyz", ""]] == \
            [True, True, False, True, False]


class TestCanonicalForm:
    @pytest.mark.parametrize("source, canonical", [
        ('"a"', '"a"'),
        ('  "a"   AND("b")', '"a" AND "b"'),
        ('"a" AND ("b" AND "c")', '"a" AND "b" AND "c"'),
        ('("a" OR "b") AND "c"', '("a" OR "b") AND "c"'),
        ('"a" OR ("b" AND "c")', '"a" OR "b" AND "c"'),
        ('NOT ("a" OR "b")', 'NOT ("a" OR "b")'),
        ('NOT (NOT "a")', 'NOT NOT "a"'),
        (r'"q\"x\\y"', r'"q\"x\\y"'),
        (r'regexp( "a\\.b" )', r'regexp("a\\.b")'),
        (r'regexp("\d")', r'regexp("\\d")'),
    ])
    def test_str_and_repr(self, source, canonical):
        condition = parse_condition(source)
        assert str(condition) == canonical
        assert repr(condition) == f"Condition({canonical})"
        assert parse_condition(canonical) == condition
        assert condition.source == source

    def test_equality_hash_pickle_immutability(self):
        one = parse_condition('"a" AND ("b" OR NOT regexp("c+"))')
        two = parse_condition('"a"   AND ("b" OR NOT regexp("c+"))')
        assert one == two and hash(one) == hash(two) and one != parse_condition('"a"')
        restored = pickle.loads(pickle.dumps(one))
        assert restored == one and restored.matches("ab") and not restored.matches("accc")
        with pytest.raises(AttributeError):
            one.source = "x"
        assert isinstance(one, Condition) and one != "a"

    def test_matches_needs_a_str(self):
        with pytest.raises(TypeError):
            parse_condition('"a"').matches(None)
        with pytest.raises(TypeError):
            parse_condition(None)


class TestErrors:
    @pytest.mark.parametrize("source, message", [
        ('"Brazil" OR "brazil" AND AND "x"',
         'column 26: expected a quoted string, regexp(...), NOT or "(" but found "AND"'),
        ('', 'column 1: expected a quoted string, regexp(...), NOT or "(" but found end of condition'),
        ('   ', 'column 4: expected a quoted string, regexp(...), NOT or "(" but found end of condition'),
        ('"a" AND', 'column 8: expected a quoted string, regexp(...), NOT or "(" but found end of '
                    'condition'),
        ('()', 'column 2: expected a quoted string, regexp(...), NOT or "(" but found ")"'),
        ('OR "a"', 'column 1: expected a quoted string, regexp(...), NOT or "(" but found "OR"'),
        ('"a" NOT "b"', 'column 5: expected AND, OR or end of condition but found "NOT"'),
        ('"a" "b"', 'column 5: expected AND, OR or end of condition but found a quoted string'),
        ('"a")', 'column 4: expected AND, OR or end of condition but found ")" (it closes no "(")'),
        ('("a" "b")', 'column 6: expected AND, OR or ")" but found a quoted string'),
        ('("a" AND ("b")', 'column 15: expected AND, OR or ")" but found end of condition '
                           '(the "(" at column 1 is never closed)'),
        ('"a" and "b"', 'column 5: expected AND, OR or end of condition but found "and" '
                        '(operators are upper case)'),
        ('Brazil', 'column 1: expected a quoted string, regexp(...), NOT or "(" but found "Brazil"'),
        ('"a" % "b"', 'column 5: expected AND, OR or end of condition but found "%"'),
        ("'a'", 'column 1: expected a quoted string, regexp(...), NOT or "(" but found "\'"'),
        ('"abc', 'column 1: this string has no closing quote'),
        ('"a" AND "b\\"', 'column 9: this string has no closing quote'),
        ('regexp "a"', 'column 8: expected "(" after regexp but found a quoted string'),
        ('regexp(a)', 'column 8: expected a quoted pattern after regexp( but found "a"'),
        ('regexp("a" "b")', 'column 12: expected ")" to close regexp( but found a quoted string'),
        ('regexp("a"', 'column 11: expected ")" to close regexp( but found end of condition'),
        ('"a" AND\n  ("b" OR)', 'line 2, column 10: expected a quoted string, regexp(...), NOT '
                                'or "(" but found ")"'),
    ])
    def test_syntax_errors_name_column_and_expectation(self, source, message):
        with pytest.raises(ConditionError) as caught:
            parse_condition(source)
        assert str(caught.value) == message

    def test_error_attributes(self):
        with pytest.raises(ConditionError) as caught:
            parse_condition('"a" AND\n"b" OR OR')
        error = caught.value
        assert (error.line, error.column, error.position) == (2, 8, 15)
        assert error.source == '"a" AND\n"b" OR OR' and isinstance(error, ValueError)
        assert error.reason.startswith("expected a quoted string")

    @pytest.mark.parametrize("pattern, column, fragment", [
        ("a[bc", 10, "missing ]"),
        ("(ab", 9, "missing )"),
        ("ab)", 9, "unexpected )"),              # RE2 quotes the whole pattern here
        (r"(a)\\1", 12, "backreferences"),        # written \\1 in the condition: the pattern \1
        ("x(?=y)", 10, "lookaround"),
        ("(?<!y)x", 9, "lookaround"),
        ("a**", 10, "bad repetition"),
    ])
    def test_invalid_regex_is_a_condition_error(self, pattern, column, fragment):
        source = f'"z" OR regexp("{pattern}")'
        with pytest.raises(ConditionError) as caught:
            parse_condition(source)
        message = str(caught.value)
        assert message.startswith(f"column {column + 7}: invalid regular expression ")
        assert fragment in message

    def test_regex_error_names_the_pattern(self):
        with pytest.raises(ConditionError, match=r'invalid regular expression "a\[" in regexp'):
            parse_condition('regexp("a[")')


class TestDeepAndLong:
    def test_ten_thousand_parentheses(self):
        depth = 10_000
        condition = parse_condition("(" * depth + '"a"' + ")" * depth)
        assert condition.matches("xa") and not condition.matches("x")
        assert str(condition) == '"a"'
        assert pickle.loads(pickle.dumps(condition)) == condition

    def test_ten_thousand_nots_and_nested_groups(self):
        assert parse_condition("NOT " * 10_000 + '"a"').matches("a")
        assert not parse_condition("NOT " * 10_001 + '"a"').matches("a")
        nested = "".join(f'("t{i}" OR ' for i in range(5_000)) + '"end"' + ")" * 5_000
        condition = parse_condition(nested)
        assert condition.matches("... end") and condition.matches("t4999") \
            and not condition.matches("x")
        right_and = '"t" AND (' * 5_000 + '"end"' + ")" * 5_000
        assert parse_condition(right_and).matches("t end")
        assert not parse_condition(right_and).matches("end")
        assert parse_condition(str(condition)) == condition

    def test_unbalanced_deep_nesting_is_a_condition_error(self):
        with pytest.raises(ConditionError, match=r'column 20003: .*the "\(" at column 1 is never'):
            parse_condition("(" * 10_000 + '"a"' + ")" * 9_999)
        with pytest.raises(ConditionError, match=r'column 20004: .* found "\)" \(it closes no'):
            parse_condition("(" * 10_000 + '"a"' + ")" * 10_001)


# ----------------------------------------------------------------------------------------------
# Randomized comparison: the same condition written as a Python expression is the oracle
# (Python's not/and/or have the same precedence as NOT/AND/OR).

WORDS = ["a", "b", "ab", "c", "é", "x y", 'q"', "\\", ""]
PATTERNS = ["a+b", "^a", "b$", "[bc]", "(?i)A", "é.", "x\\sy", "^$"]


def random_condition(rng: random.Random, depth: int = 0) -> tuple[str, str]:
    """(condition source, equivalent Python expression over `text`)."""
    roll = rng.random()
    if depth > 4 or roll < 0.35:
        if rng.random() < 0.6:
            word = rng.choice(WORDS)
            literal = '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'
            return literal, f"({word!r} in text)"
        pattern = rng.choice(PATTERNS)
        literal = '"' + pattern.replace("\\", "\\\\") + '"'
        return f"regexp({literal})", f"(re.search({pattern!r}, text) is not None)"
    if roll < 0.5:
        inner, python = random_condition(rng, depth + 1)
        return f"NOT {inner}", f"not {python}"
    if roll < 0.6:
        inner, python = random_condition(rng, depth + 1)
        return f"( {inner} )", f"({python})"
    left, left_py = random_condition(rng, depth + 1)
    right, right_py = random_condition(rng, depth + 1)
    word = rng.choice(["AND", "OR"])
    return f"{left} {word} {right}", f"{left_py} {word.lower()} {right_py}"


def test_random_conditions_agree_with_python_boolean_operators():
    rng = random.Random(18)
    texts = ["", "a", "ab", "b", "c", "aab", "Ab", "éa", "x y", 'q"', "\\", "x\ty", "bca"]
    for _ in range(400):
        source, python = random_condition(rng)
        condition = parse_condition(source)
        again = parse_condition(str(condition))
        for text in texts:
            expected = bool(eval(python, {"re": re, "text": text}))  # noqa: S307 - test oracle
            assert condition.matches(text) is expected, (source, text)
            assert again.matches(text) is expected, (str(condition), text)
