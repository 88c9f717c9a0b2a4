"""The Text Matching condition language: parse a boolean condition once, test it on many texts.

Grammar (NOT binds tighter than AND, AND tighter than OR; AND and OR are left-associative):

    condition := or_expr
    or_expr   := and_expr ("OR" and_expr)*
    and_expr  := unary ("AND" unary)*
    unary     := "NOT" unary | "(" or_expr ")" | STRING | "regexp" "(" STRING ")"
    STRING    := '"' ... '"'    with \\" for a quote and \\\\ for a backslash; any other backslash
                                pair is kept as written, so regexp("\\d+") means the regex \\d+

Operators are upper case (AND, OR, NOT); whitespace (spaces, tabs, newlines) separates tokens.

Semantics. A string operand is true when it occurs in the text as a case-sensitive substring (the
empty string occurs in every text). regexp(P) is true when the regular expression P matches
anywhere in the text (a search, not a full match: anchor with ^ and $ for an exact match; ^ and $
are the start and end of the whole text, not of lines, unless P turns on (?m)).

Regular expressions use RE2 syntax (google-re2), which matches in time linear in the text: there
is no catastrophic backtracking. RE2 does not support backreferences (\\1), lookahead or
lookbehind ((?=...), (?!...), (?<=...), (?<!...)), atomic groups, possessive quantifiers or
\\Z (write \\z); a pattern using them is a ConditionError. Patterns match on the UTF-8 text, so .
is one character, not one byte.

Complexity. Parsing is one left-to-right pass (a tokenizer and an operator-precedence parser with
explicit stacks): time and memory linear in the condition, with no recursion, so 10,000 nested
parentheses parse like any other condition. matches() walks the expression tree with an explicit
stack, short-circuiting AND and OR; each distinct operand is tested at most once per text, each
test linear in the text (CPython's substring search for strings, RE2 for regexes), so the cost is
O(#distinct operands x len(text)) at worst, plus O(#operators).

Errors. A condition that does not parse raises ConditionError naming the 1-based column (and the
line when the condition has several) and what was expected there, e.g.
    column 17: expected a quoted string, regexp(...), NOT or "(" but found "AND"
An invalid regex is a ConditionError with the pattern, the column where the problem was found and
RE2's description.
"""

from __future__ import annotations

import re

import re2

__all__ = ["Condition", "ConditionError", "parse_condition"]

# Node kinds of the flat expression tree (see Condition).
_ATOM, _NOT, _AND, _OR = 0, 1, 2, 3
_PRECEDENCE = {_OR: 1, _AND: 2, _NOT: 3, _ATOM: 4}
_OPERATOR_WORDS = {"AND": _AND, "OR": _OR}

# Tokenizer pieces: each is a single character class, so matching them at a position is linear.
_SPACE = re.compile(r"\s+")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PLAIN = re.compile(r'[^"\\]+')

_EXPECT_OPERAND = 'a quoted string, regexp(...), NOT or "("'


class ConditionError(ValueError):
    """A condition that cannot be parsed or compiled.

    Attributes: source (the condition), position (0-based character offset), line and column
    (1-based), reason (the message without the location)."""

    def __init__(self, source: str, position: int, reason: str):
        self.source = source
        self.position = position
        self.line = source.count("\n", 0, position) + 1
        self.column = position - (source.rfind("\n", 0, position) + 1) + 1
        self.reason = reason
        where = (f"line {self.line}, column {self.column}" if "\n" in source
                 else f"column {self.column}")
        super().__init__(f"{where}: {reason}")


def _show(text: str, limit: int = 24) -> str:
    return '"' + (text if len(text) <= limit else text[:limit] + "...") + '"'


class _Token:
    __slots__ = ("kind", "value", "start", "end")

    def __init__(self, kind: str, value, start: int, end: int):
        self.kind = kind      # "string", "regexp", "AND", "OR", "NOT", "(", ")", "end", "bad"
        self.value = value
        self.start = start
        self.end = end

    def describe(self, source: str) -> str:
        if self.kind == "string":
            return "a quoted string"
        if self.kind == "regexp":
            return "regexp(...)"
        if self.kind == "end":
            return "end of condition"
        shown = _show(source[self.start:self.end])
        if self.kind == "bad" and source[self.start:self.end].upper() in ("AND", "OR", "NOT"):
            shown += " (operators are upper case)"
        return shown


def _read_string(source: str, start: int) -> tuple[str, int]:
    """Decode the string literal whose opening quote is at `start`; returns (value, end)."""
    pieces = []
    i = start + 1
    n = len(source)
    while True:
        plain = _PLAIN.match(source, i)
        if plain:
            pieces.append(plain.group())
            i = plain.end()
        if i >= n:
            raise ConditionError(source, start, "this string has no closing quote")
        if source[i] == '"':
            return "".join(pieces), i + 1
        # A backslash: \" and \\ are escapes, anything else is kept as written.
        if i + 1 >= n:
            raise ConditionError(source, start, "this string has no closing quote")
        following = source[i + 1]
        pieces.append(following if following in '"\\' else "\\" + following)
        i += 2


def _string_offsets(source: str, start: int) -> list[int]:
    """Source offset of each character of the decoded literal at `start` (used for errors)."""
    offsets = []
    i = start + 1
    while source[i] != '"':
        if source[i] == "\\":
            if source[i + 1] not in '"\\':
                offsets.append(i)
            offsets.append(i)
            i += 2
        else:
            offsets.append(i)
            i += 1
    return offsets


def _skip_space(source: str, i: int) -> int:
    space = _SPACE.match(source, i)
    return space.end() if space else i


def _tokens(source: str):
    """Yield the tokens of `source` left to right, then one "end" token."""
    n = len(source)
    i = _skip_space(source, 0)
    while i < n:
        char = source[i]
        if char == '"':
            value, end = _read_string(source, i)
            yield _Token("string", value, i, end)
        elif char in "()":
            end = i + 1
            yield _Token(char, None, i, end)
        elif word := _WORD.match(source, i):
            end = word.end()
            text = word.group()
            if text == "regexp":
                end = _read_regexp_call(source, i, end)
                yield _Token("regexp", None, i, end)
            elif text in ("AND", "OR", "NOT"):
                yield _Token(text, None, i, end)
            else:
                yield _Token("bad", None, i, end)
        else:
            end = i + 1
            yield _Token("bad", None, i, end)
        i = _skip_space(source, end)
    yield _Token("end", None, n, n)


def _read_regexp_call(source: str, start: int, i: int) -> int:
    """Check the shape regexp ( "..." ) after the word at `start`; returns the end offset."""
    i = _skip_space(source, i)
    if i >= len(source) or source[i] != "(":
        raise ConditionError(source, i, f'expected "(" after regexp but found {_found_at(source, i)}')
    i = _skip_space(source, i + 1)
    if i >= len(source) or source[i] != '"':
        raise ConditionError(source, i, "expected a quoted pattern after regexp( but found "
                             + _found_at(source, i))
    _, i = _read_string(source, i)
    i = _skip_space(source, i)
    if i >= len(source) or source[i] != ")":
        raise ConditionError(source, i, 'expected ")" to close regexp( but found '
                             + _found_at(source, i))
    return i + 1


def _found_at(source: str, i: int) -> str:
    if i >= len(source):
        return "end of condition"
    if source[i] == '"':
        return "a quoted string"
    word = _WORD.match(source, i)
    return _show(word.group() if word else source[i])


def _compile_regexp(source: str, token: _Token):
    """Compile the pattern of a regexp(...) token with RE2, turning its errors into ConditionError."""
    quote = source.index('"', token.start)
    pattern, _ = _read_string(source, quote)
    options = re2.Options()
    options.log_errors = False  # RE2 would also print the error on stderr
    try:
        return pattern, re2.compile(pattern, options)
    except re2.error as error:
        message = error.args[0] if error.args else str(error)
        if isinstance(message, bytes):
            message = message.decode("utf-8", "replace")
        # RE2 messages end with the offending fragment ("missing ]: [abc"); point at it.
        fragment = message.split(": ", 1)[1] if ": " in message else ""
        at = pattern.find(fragment) if fragment else -1
        offsets = _string_offsets(source, quote)
        position = offsets[at] if 0 <= at < len(offsets) else quote
        hint = ""
        if re.search(r"\\[1-9]|\(\?<?[=!]|\(\?>|[*+?}]\+", pattern):
            hint = " (RE2 has no backreferences, lookaround, atomic groups or possessive quantifiers)"
        raise ConditionError(source, position, f"invalid regular expression {_show(pattern, 60)} "
                             f"in regexp(...): {message}{hint}") from None


class Condition:
    """A parsed condition: immutable, hashable, picklable (it pickles as its source text).

    The expression is a flat tuple of nodes (no nested Python objects, so equality, hashing and
    printing never recurse): node i is (_ATOM, atom index), (_NOT, child) or (_AND | _OR,
    (child, ...)); the root is node _root. Atoms are the
    distinct operands: ("string", text) or ("regexp", pattern)."""

    __slots__ = ("source", "_nodes", "_root", "_atoms", "_compiled", "_canonical")

    def __init__(self, source: str, nodes: tuple, root: int, atoms: tuple, compiled: tuple):
        object.__setattr__(self, "source", source)
        object.__setattr__(self, "_nodes", nodes)
        object.__setattr__(self, "_root", root)
        object.__setattr__(self, "_atoms", atoms)
        object.__setattr__(self, "_compiled", compiled)
        object.__setattr__(self, "_canonical", self._render())

    def __setattr__(self, name, value):
        raise AttributeError("Condition is immutable")

    def __reduce__(self):
        return (parse_condition, (self.source,))

    def __eq__(self, other) -> bool:
        return isinstance(other, Condition) and self._canonical == other._canonical

    def __hash__(self) -> int:
        return hash(self._canonical)

    def __str__(self) -> str:
        return self._canonical

    def __repr__(self) -> str:
        return f"Condition({self._canonical})"

    @property
    def operands(self) -> tuple[tuple[str, str], ...]:
        """The distinct operands, in order of first appearance: ("string" | "regexp", text)."""
        return self._atoms

    def matches(self, text: str) -> bool:
        """True when `text` satisfies the condition."""
        if not isinstance(text, str):
            raise TypeError(f"matches() needs a str, not {type(text).__name__}")
        nodes, atoms, compiled = self._nodes, self._atoms, self._compiled
        known: list = [None] * len(atoms)
        encoded = None
        values: list[bool] = []
        # Work items are (node, step): step 0 = start; for NOT, 1 = negate the child's value; for
        # AND/OR, step k > 0 = the value of child k-1 is on top of `values`.
        work = [(self._root, 0)]
        while work:
            index, step = work.pop()
            kind, arg = nodes[index]
            if kind == _ATOM:
                value = known[arg]
                if value is None:
                    regex = compiled[arg]
                    if regex is None:
                        value = atoms[arg][1] in text
                    else:
                        if encoded is None:
                            # Encode once per text: RE2 would re-encode a str on every search.
                            encoded = text.encode("utf-8", "surrogatepass")
                        value = regex.search(encoded) is not None
                    known[arg] = value
                values.append(value)
            elif kind == _NOT:
                if step == 0:
                    work.append((index, 1))
                    work.append((arg, 0))
                else:
                    values[-1] = not values[-1]
            else:
                if step > 0:
                    value = values[-1]
                    if step == len(arg) or value == (kind == _OR):
                        continue  # decided: the last child's value is the node's value
                    values.pop()
                work.append((index, step + 1))
                work.append((arg[step], 0))
        return values[-1]

    def _render(self) -> str:
        """The canonical text: operators upper case, single spaces, parentheses only where
        precedence needs them. parse_condition(str(c)) == c."""
        nodes, atoms = self._nodes, self._atoms
        out: list[str] = []
        work: list = [(self._root, 0)]
        while work:
            item = work.pop()
            if isinstance(item, str):
                out.append(item)
                continue
            index, parent_precedence = item
            kind, arg = nodes[index]
            if kind == _ATOM:
                kind_name, text = atoms[arg]
                quoted = '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
                out.append(quoted if kind_name == "string" else f"regexp({quoted})")
                continue
            precedence = _PRECEDENCE[kind]
            wrap = precedence < parent_precedence
            if wrap:
                work.append(")")
            if kind == _NOT:
                work.append((arg, precedence))
                work.append("NOT ")
            else:
                joiner = " AND " if kind == _AND else " OR "
                for position, child in enumerate(reversed(arg)):
                    if position:
                        work.append(joiner)
                    work.append((child, precedence))
            if wrap:
                work.append("(")
        return "".join(out)


def parse_condition(source: str) -> Condition:
    """Parse a condition (see the module docstring); raises ConditionError when it is invalid."""
    if not isinstance(source, str):
        raise TypeError(f"a condition is a str, not {type(source).__name__}")
    nodes: list = []
    atom_index: dict = {}
    atoms: list = []
    compiled: list = []
    operands: list[int] = []          # node indices of finished sub-expressions
    operators: list = []              # (kind, source offset); kind "(" for an open parenthesis

    def reduce_top() -> None:
        kind, _ = operators.pop()
        if kind == _NOT:
            nodes.append([_NOT, operands.pop()])
        else:
            right = operands.pop()
            left = operands.pop()
            if nodes[left][0] == kind and isinstance(nodes[left][1], list):
                # Extend a chain "a AND b AND c" in place: one node, amortized O(1) per term.
                nodes[left][1].append(right)
                operands.append(left)
                return
            nodes.append([kind, [left, right]])
        operands.append(len(nodes) - 1)

    expect_operand = True
    depth = 0                         # open parentheses
    for token in _tokens(source):
        if expect_operand:
            if token.kind in ("string", "regexp"):
                if token.kind == "string":
                    key = ("string", token.value)
                    regex = None
                else:
                    pattern, regex = _compile_regexp(source, token)
                    key = ("regexp", pattern)
                if key not in atom_index:
                    atom_index[key] = len(atoms)
                    atoms.append(key)
                    compiled.append(regex)
                nodes.append([_ATOM, atom_index[key]])
                operands.append(len(nodes) - 1)
                expect_operand = False
            elif token.kind == "NOT":
                operators.append((_NOT, token.start))
            elif token.kind == "(":
                operators.append(("(", token.start))
                depth += 1
            else:
                raise ConditionError(source, token.start,
                                     f"expected {_EXPECT_OPERAND} but found {token.describe(source)}")
            continue
        if token.kind in ("AND", "OR"):
            kind = _OPERATOR_WORDS[token.kind]
            while (operators and operators[-1][0] != "("
                   and _PRECEDENCE[operators[-1][0]] >= _PRECEDENCE[kind]):
                reduce_top()
            operators.append((kind, token.start))
            expect_operand = True
        elif token.kind == ")":
            while operators and operators[-1][0] != "(":
                reduce_top()
            if not operators:
                raise ConditionError(source, token.start, 'expected AND, OR or end of condition '
                                     'but found ")" (it closes no "(")')
            operators.pop()
            depth -= 1
        elif token.kind == "end":
            while operators and operators[-1][0] != "(":
                reduce_top()
            if operators:
                opened = ConditionError(source, operators[-1][1], "")
                where = (f"line {opened.line}, column {opened.column}" if "\n" in source
                         else f"column {opened.column}")
                raise ConditionError(source, token.start, 'expected AND, OR or ")" but found end '
                                     f'of condition (the "(" at {where} is never closed)')
        else:
            expected = 'AND, OR or ")"' if depth else "AND, OR or end of condition"
            raise ConditionError(source, token.start,
                                 f"expected {expected} but found {token.describe(source)}")
    frozen = tuple((kind, tuple(arg) if isinstance(arg, list) else arg) for kind, arg in nodes)
    return Condition(source, frozen, operands[-1], tuple(atoms), tuple(compiled))
