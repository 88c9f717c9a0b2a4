"""Whether a model.onnx file is a whole ONNX model, read without loading its weights: the check
the launcher runs on a --lm_uri / --model_uri folder before the run (pipelines/judge_options.py
check_model_folder), so that a truncated copy or a wrong file stops the run at once instead of
failing every datum on the workers. The file is walked as protobuf fields (onnx.proto's field
numbers below), the weights' payloads skipped by seeking: milliseconds and no memory for a model
of any size.
"""

from __future__ import annotations

# onnx.proto's field numbers that onnx_file_problem reads: ModelProto.graph; GraphProto.initializer
# and .sparse_initializer (the weights); TensorProto.data_location (value 1: EXTERNAL);
# SparseTensorProto.values and .indices (two tensors)
_MODEL_GRAPH = 7
_GRAPH_WEIGHTS = (5, 15)
_TENSOR_LOCATION = 14
_SPARSE_TENSORS = (1, 2)


class _Malformed(ValueError):
    pass


def _varint(stream) -> int:
    value = shift = 0
    while True:
        byte = stream.read(1)
        if not byte:
            raise _Malformed("the file ends inside a field (a truncated copy?)")
        value |= (byte[0] & 0x7F) << shift
        if byte[0] < 0x80:
            return value
        shift += 7
        if shift > 63:
            raise _Malformed("a number in it runs over 10 bytes")


def _fields(stream, end: int, outside: str = "its message"):
    """(field number, wire type, start, payload start, stop, value) of each field of the
    protobuf message from the stream's position to byte `end`, payloads skipped: start is where
    the field's tag begins, stop where the field ends, value a varint's value or a payload's
    length. A field that does not end by `end` raises _Malformed (outside: what ends there)."""
    while stream.tell() < end:
        start = stream.tell()
        tag = _varint(stream)
        number, wire = tag >> 3, tag & 7
        if number == 0 or wire not in (0, 1, 2, 5):
            raise _Malformed(f"byte {start:,} starts no protobuf field")
        value = _varint(stream) if wire in (0, 2) else 0
        payload = stream.tell()
        stop = payload + {0: 0, 1: 8, 2: value, 5: 4}[wire]
        if stop > end:
            raise _Malformed(f"the field at byte {start:,} runs past the end of {outside}")
        yield number, wire, start, payload, stop, value
        stream.seek(stop)


def _external(stream, payload: int, stop: int, sparse: bool) -> bool:
    """Whether a TensorProto (sparse: a SparseTensorProto's tensors) keeps its data in another
    file."""
    stream.seek(payload)
    for number, wire, _, inner, end, value in _fields(stream, stop):
        if sparse and number in _SPARSE_TENSORS and wire == 2 and _external(stream, inner, end, False):
            return True
        if not sparse and number == _TENSOR_LOCATION and wire == 0 and value == 1:
            return True
    return False


def onnx_file_problem(stream) -> str | None:
    """Why the ONNX model in a seekable binary stream cannot load, or None. The file is walked
    as protobuf fields with the weights' bytes skipped, so the cost does not grow with the
    weights: every field must end inside the file (a truncated copy fails here), all but the
    weights must decode as onnx's ModelProto (random bytes fail here), and its graph must take
    input_ids and give an output. Weights kept in other files (ONNX external data) are refused:
    the workers read model.onnx alone. A file that passes may still use an operator ONNX
    Runtime lacks, or be a graph of the wrong kind: those fail each datum (model_error). A stream
    that cannot seek is not checked (None)."""
    import onnx
    from google.protobuf.message import DecodeError

    if not stream.seekable():   # no filesystem of Beam's gives one; never refuse a model unread
        return None
    stream.seek(0, 2)
    size = stream.tell()
    stream.seek(0)
    if size == 0:
        return "the file is empty"
    model, graph = bytearray(), None
    try:
        for number, wire, start, payload, stop, _ in _fields(stream, size, "the file (a truncated copy?)"):
            if number != _MODEL_GRAPH or wire != 2:
                stream.seek(start)
                model += stream.read(stop - start)
                continue
            graph = graph or bytearray()
            stream.seek(payload)
            for inner, inner_wire, field_start, field_payload, end, _ in _fields(stream, stop):
                if inner in _GRAPH_WEIGHTS and inner_wire == 2:
                    if _external(stream, field_payload, end, inner == _GRAPH_WEIGHTS[1]):
                        return ("its weights are kept in other files (ONNX external data, used for "
                                "models over 2 GB), which the workers do not read")
                    continue
                stream.seek(field_start)
                graph += stream.read(end - field_start)
        if graph is None:
            return "it is not an ONNX model file: it holds no graph"
        onnx.ModelProto.FromString(bytes(model))
        parsed = onnx.GraphProto.FromString(bytes(graph))
    except _Malformed as error:
        return f"it is not an ONNX model file: {error}"
    except DecodeError as error:
        return f"it is not an ONNX model file ({error})"
    inputs = [i.name for i in parsed.input]
    if "input_ids" not in inputs:
        # the names are the file's text: a few, each cut short (a bad byte leaves a name bytes)
        shown = ", ".join(repr(name)[:40] for name in inputs[:5]) + (", ..." if len(inputs) > 5 else "")
        return f"its graph takes no input named input_ids (its inputs: {shown or 'none'})"
    if not parsed.output:
        return "its graph has no output"
    return None
