"""schemas/json_pieces.py: cutting a JSON array document into pieces that parse on their own.

Against json.loads of the whole document, on random arrays: strings holding brackets, braces,
commas, quotes and backslashes (so escapes, some across scan blocks), nested values, whitespace
between tokens. The cuts are exactly the separators found the slow way, the pieces' elements
joined are the document's, and each piece's first index is right. A document that is not one
valid array either gives no pieces or leaves a piece that does not parse or is empty."""

from __future__ import annotations

import io
import json
import random

import pytest

from evalbeam.schemas import json_pieces
from evalbeam.schemas.json_pieces import array_pieces, piece_text


def parsed_pieces(raw: bytes, piece_bytes: int, max_depth: int = 64):
    """The pieces' parsed arrays (None for one that does not parse), or None: read whole."""
    cut = array_pieces(io.BytesIO(raw), piece_bytes, max_depth)
    if cut is None:
        return None, None
    values = []
    for k, (start, end, first) in enumerate(cut.pieces):
        text = piece_text(raw[start:end], k == 0, k == len(cut.pieces) - 1)
        try:
            values.append((first, json.loads(text)))
        except ValueError:
            values.append((first, None))
    return cut, values


def random_value(rng, depth=0):
    kind = rng.randrange(6 if depth < 5 else 3)
    if kind == 0:
        return rng.choice([0, 1.5, -2, True, False, None, 10 ** 30])
    if kind in (1, 2):
        return "".join(rng.choice('[]{},:ab "\\\n\u00e9') for _ in range(rng.randrange(8)))
    if kind == 3:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {str(rng.randrange(100)) + rng.choice(",[{"): random_value(rng, depth + 1)
            for _ in range(rng.randrange(4))}


def dumps_loosely(value, rng) -> str:
    """json.dumps with random whitespace between tokens (JSON's four whitespace bytes)."""
    space = lambda: "".join(rng.choice(" \t\n\r") for _ in range(rng.randrange(3)))  # noqa: E731
    if isinstance(value, list):
        return "[" + space() + ("," + space()).join(dumps_loosely(v, rng) + space() for v in value) + "]"
    if isinstance(value, dict):
        return "{" + space() + ",".join(space() + json.dumps(k) + space() + ":" + space()
                                        + dumps_loosely(v, rng) + space()
                                        for k, v in value.items()) + "}"
    return json.dumps(value)


def separators(raw: bytes) -> list[int]:
    """The commas that separate the elements of a valid array document, found the slow way: the
    document's bytes up to a comma, closed by "]", parse exactly when the comma lies at depth 1
    outside every string."""
    found = []
    for position in range(len(raw)):
        if raw[position:position + 1] == b",":
            try:
                json.loads(raw[:position] + b"]")
            except ValueError:
                continue
            found.append(position)
    return found


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("block", [7, 64, 4 << 20])
def test_pieces_hold_the_documents_elements_in_order(monkeypatch, seed, block):
    monkeypatch.setattr(json_pieces, "BLOCK_BYTES", block)
    rng = random.Random(seed)
    split = 0
    for _ in range(60):
        elements = [random_value(rng) for _ in range(rng.randrange(2, 40))]
        raw = (rng.choice(["", "\n ", "\ufeff"]) + dumps_loosely(elements, rng)
               + rng.choice(["", "\n", " \r\n"])).encode()
        whole = json.loads(raw)
        piece_bytes = rng.choice([1, 5, 20, 80, len(raw) // 2 + 1])
        # the cuts expected: the first separator at or after each piece_bytes boundary
        expected, target = [], piece_bytes
        for position in separators(raw):
            if position >= target:
                expected.append(position)
                target = position + piece_bytes
        cut, values = parsed_pieces(raw, piece_bytes)
        if not expected:
            assert cut is None
            continue
        split += 1
        assert [end for _, end, _ in cut.pieces[:-1]] == expected
        joined = []
        for first, value in values:
            assert value, raw
            assert first == len(joined)
            joined += value
        assert joined == whole
        assert json.loads(raw[cut.head[0]:cut.head[1]]) == whole[0]
    assert split > 30


def test_documents_read_whole_or_failing_in_a_piece():
    """What array_pieces refuses (None), and invalid arrays whose pieces show it."""
    refused = [b"", b"   ", b'{"a": [1, 2, 3]}', b"[1, 2, 3", b"[1, 2, 3]]", b"[1, 2] [3, 4]",
               b"[1, 2, 3]x", b'[1, "2, 3]', b"[1, 2, 3]\x00",
               "[1, 2, 3]".encode("utf-16-le"), b"[" * 70 + b"]" * 70 + b"", b"[1]",
               b"[[1, 2, 3]]", b"]1, 2["]
    for raw in refused:
        assert array_pieces(io.BytesIO(raw), 1, 64) is None, raw
    # valid arrays of a single element at depth 1, too deep ones: whole as well
    assert array_pieces(io.BytesIO(b"[" + b"[" * 65 + b"]" * 65 + b", 1]"), 1, 64) is None
    # invalid JSON that is still one bracketed array: a piece fails or is empty
    for raw in (b"[1, , 2]", b"[1, 2, ]", b"[, 1, 2]", b"[1, tru, 3]", b"[1 2, 3]",
                b'[{"a": 1,}, 2]', b"[1, 2, 3,,]"):
        cut, values = parsed_pieces(raw, 1)
        assert cut is not None, raw
        assert any(not value for _, value in values), raw


@pytest.mark.parametrize("block", [1, 2, 3, 5])
def test_state_carried_across_blocks(monkeypatch, block):
    """Strings, escapes (a backslash ending a block escapes the next block's first byte) and
    brackets that close in a later block than they open."""
    monkeypatch.setattr(json_pieces, "BLOCK_BYTES", block)
    raw = b'[ "a,b,[c", {"k": [1, 2, {"x": ",]\\\\"}]}, "\\",\\"", [[3]], "z\\\\", 4 ]'
    cut, values = parsed_pieces(raw, 1)
    assert [v for _, value in values for v in value] == json.loads(raw)
    assert [first for first, _ in values] == [0, 1, 2, 3, 4, 5]


def object_document(rng) -> tuple[bytes, dict]:
    """A random object document with an "annotations" array among other members (arrays,
    objects, strings holding brackets and the member's name), its name sometimes written with
    escapes, in random order and spacing; and its value."""
    members = {"images": [random_value(rng) for _ in range(rng.randrange(4))],
               "info": {"about annotations": random_value(rng), "x": "\"annotations\": [1, 2]"},
               "tail": "]}, [", "categories": [{"id": 1, "name": "a,b"}]}
    members = dict(rng.sample(sorted(members.items()), rng.randrange(len(members) + 1)))
    annotations = [random_value(rng) for _ in range(rng.randrange(2, 40))]
    space = lambda: "".join(rng.choice(" \t\n\r") for _ in range(rng.randrange(3)))  # noqa: E731
    items = [(json.dumps(k), dumps_loosely(v, rng)) for k, v in members.items()]
    name = rng.choice(['"annotations"', '"annot\\u0061tions"', '"\\u0061nnotations"'])
    items.insert(rng.randrange(len(items) + 1), (name, dumps_loosely(annotations, rng)))
    text = "{" + ",".join(space() + k + space() + ":" + space() + v + space() for k, v in items) + "}"
    raw = (rng.choice(["", "\ufeff", " \n"]) + text + rng.choice(["", "\n"])).encode()
    return raw, dict(members, annotations=annotations)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("block", [7, 64, 4 << 20])
def test_a_members_array_is_cut_like_an_array_document(monkeypatch, seed, block):
    """An object's "annotations" array: the cuts are the array's separators found the slow
    way (counted from the array's "["), the pieces hold its elements, and the rest of the
    document, the array replaced by [], parses to the document without them."""
    monkeypatch.setattr(json_pieces, "BLOCK_BYTES", block)
    rng = random.Random(seed)
    split = 0
    for _ in range(40):
        raw, whole = object_document(rng)
        assert json.loads(raw) == whole
        piece_bytes = rng.choice([1, 5, 20, 80])
        cut = array_pieces(io.BytesIO(raw), piece_bytes, 64, member="annotations")
        if cut is None:
            continue
        split += 1
        start, end = cut.span
        assert json.loads(raw[start:end]) == whole["annotations"]
        expected, target = [], start + piece_bytes
        for position in separators(raw[start:end]):
            if start + position >= target:
                expected.append(start + position)
                target = start + position + piece_bytes
        assert [stop for _, stop, _ in cut.pieces[:-1]] == expected
        joined = []
        for k, (a, b, first) in enumerate(cut.pieces):
            assert first == len(joined)
            joined += json.loads(piece_text(raw[a:b], k == 0, k == len(cut.pieces) - 1))
        assert joined == whole["annotations"]
        assert json.loads(raw[cut.head[0]:cut.head[1]]) == whole["annotations"][0]
        rest = raw[:start] + b"[]" + raw[end:]
        assert json.loads(rest) == dict(whole, annotations=[])
    assert split > 25


def test_members_read_whole_or_failing_in_a_piece():
    """What a member cut refuses (None), and invalid documents whose pieces or rest show it."""
    many = "{" + ", ".join(f'"k{i}": []' for i in range(json_pieces.MAX_MEMBERS + 1))
    refused = [b'{"annotations": [1, 2, 3], "annotations": [4, 5]}',
               b'{"x": "annotations", "annotations": [1, 2, 3]}',
               b'{"annotations": {"a": 1, "b": 2}}', b'{"annotations": 5, "y": [1, 2]}',
               b"[1, 2, 3]", b'{"images": [1, 2, 3]}', b'{"annotations": [1, 2, 3]} {"a": 1}',
               b'{"annotations": [1, 2, 3]', b'{"annotations": [1]}', b'{"a": {"annotations": [1, 2]}}',
               b'{"annotations"' + b" " * 5000 + b": [1, 2, 3]}",
               (many + ', "annotations": [1, 2, 3]}').encode(), b'{"annotations": [1, 2, 3]}\x00']
    for raw in refused:
        assert array_pieces(io.BytesIO(raw), 1, 64, member="annotations") is None, raw
    cut = array_pieces(io.BytesIO(b'{"annotations" \n:\t [1, 2, 3]}'), 1, 64, member="annotations")
    assert [first for _, _, first in cut.pieces] == [0, 1, 2]
    # invalid documents that still cut: a piece or the rest does not parse (or is empty)
    for raw in (b'{"annotations": [1, , 2]}', b'{"annotations": [1, 2,]}',
                b'{"images": [tru], "annotations": [1, 2, 3]}', b'{"annotations": [1, 2] "a": 1}'):
        cut = array_pieces(io.BytesIO(raw), 1, 64, member="annotations")
        assert cut is not None, raw
        texts = [piece_text(raw[a:b], k == 0, k == len(cut.pieces) - 1)
                 for k, (a, b, _) in enumerate(cut.pieces)]
        texts.append(raw[:cut.span[0]] + b"[]" + raw[cut.span[1]:])
        failed = 0
        for text in texts:
            try:
                failed += not json.loads(text)
            except ValueError:
                failed += 1
        assert failed, raw
