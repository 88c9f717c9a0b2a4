"""Whether a model.onnx file is a whole ONNX model, read without loading its weights: the check
the launcher runs on a --lm_uri / --model_uri folder before the run (pipelines/tasks/judge_options.py
check_model_folder), so that a truncated copy or a wrong file stops the run at once instead of
failing every datum on the workers. The file is walked as protobuf fields (onnx.proto's field
numbers below), the weights' payloads skipped by seeking: milliseconds and no memory for a model
of any size. The same walk reads the sizes that bound the token ids the model takes (read_onnx_file:
its logits' last dimension, the rows of the embedding table input_ids index), so that a tokenizer
of another model can be told before the run too.
"""

from __future__ import annotations

from dataclasses import dataclass

# onnx.proto's field numbers that onnx_file_problem reads: ModelProto.graph; GraphProto.initializer
# and .sparse_initializer (the weights); TensorProto.dims, .name and .data_location (value 1:
# EXTERNAL); SparseTensorProto.values and .indices (two tensors)
_MODEL_GRAPH = 7
_GRAPH_WEIGHTS = (5, 15)
_TENSOR_DIMS = 1
_TENSOR_NAME = 8
_TENSOR_LOCATION = 14
_SPARSE_TENSORS = (1, 2)
# a weight's name or packed dims longer than this are not read (no real export comes near): a
# hostile file cannot make the check read much more than the graph's own bytes
_MAX_HEADER_BYTES = 4096
# operators that pass token ids on unchanged in value (an export reshapes input_ids before its
# embedding's Gather: GPT-2's and T5's do)
_SAME_IDS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Cast", "Identity")


@dataclass(frozen=True)
class OnnxFile:
    """What read_onnx_file found: problem (why the model cannot load, or None); logits (the last
    dimension of the output "logits", else of the first output, when the graph fixes it: a
    causal LM's vocabulary); embedding ((name, rows) of the 2-D weight that input_ids index
    with a Gather, the smallest if several: the ids the model can take), None when unknown."""

    problem: str | None
    logits: int | None = None
    embedding: tuple | None = None


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


def _tensor_header(stream, payload: int, stop: int) -> tuple[str | None, list, bool]:
    """(name, dims, external) of a dense TensorProto, its data skipped. dims are written one
    varint per field by onnx (proto2) or packed by other writers: both are read."""
    name, dims, external = None, [], False
    stream.seek(payload)
    for number, wire, _, inner, end, value in _fields(stream, stop):
        if number == _TENSOR_DIMS and wire == 0:
            dims.append(value)
        elif number == _TENSOR_DIMS and wire == 2 and value <= _MAX_HEADER_BYTES:
            stream.seek(inner)
            while stream.tell() < end:
                dims.append(_varint(stream))
            if stream.tell() != end:
                raise _Malformed("a tensor's packed dims run past their field")
        elif number == _TENSOR_NAME and wire == 2 and value <= _MAX_HEADER_BYTES:
            stream.seek(inner)
            name = stream.read(value).decode("utf-8", "replace")
        elif number == _TENSOR_LOCATION and wire == 0 and value == 1:
            external = True
    return name, dims, external


def _embedding(graph, shapes: dict) -> tuple | None:
    """(name, rows) of the smallest 2-D weight that a Gather indexes (on axis 0) with input_ids,
    or with a tensor the ops of _SAME_IDS made from it; None when no such weight is found (a
    quantized or unusual export: the model's size is then unknown, never guessed). A graph's
    nodes are in topological order, so one pass follows the ids."""
    ids, found = {"input_ids"}, []
    for node in graph.node:
        if node.op_type in _SAME_IDS and node.input and node.input[0] in ids:
            ids.update(node.output)
        elif node.op_type == "Gather" and len(node.input) == 2 and node.input[1] in ids:
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
            dims = shapes.get(node.input[0])
            if axis == 0 and dims is not None and len(dims) == 2 and 0 < dims[0] < 2 ** 62:
                found.append((node.input[0], dims[0]))
    return min(found, key=lambda pair: pair[1]) if found else None


def _logits_size(graph) -> int | None:
    """The last dimension of the output "logits" (else of the first output), when fixed."""
    outputs = list(graph.output)
    output = next((o for o in outputs if o.name == "logits"), outputs[0])
    dims = output.type.tensor_type.shape.dim
    if dims and dims[-1].HasField("dim_value") and dims[-1].dim_value > 0:
        return dims[-1].dim_value
    return None


def onnx_file_problem(stream) -> str | None:
    """Why the ONNX model in a seekable binary stream cannot load, or None (read_onnx_file)."""
    return read_onnx_file(stream).problem


def read_onnx_file(stream) -> OnnxFile:
    """Why the ONNX model in a seekable binary stream cannot load (or None), and the sizes of
    OnnxFile. The file is walked as protobuf fields with the weights' bytes skipped (only their
    names and dims are read), so the cost does not grow with the weights: every field must end inside the file (a truncated copy fails here), all but the
    weights must decode as onnx's ModelProto (random bytes fail here), and its graph must take
    input_ids and give an output. Weights kept in other files (ONNX external data) are refused:
    the workers read model.onnx alone. A file that passes may still use an operator ONNX
    Runtime lacks, or be a graph of the wrong kind: those fail each datum (model_error). A stream
    that cannot seek is not checked (no problem, no sizes)."""
    import onnx
    from google.protobuf.message import DecodeError

    if not stream.seekable():   # no filesystem of Beam's gives one; never refuse a model unread
        return OnnxFile(None)
    stream.seek(0, 2)
    size = stream.tell()
    stream.seek(0)
    if size == 0:
        return OnnxFile("the file is empty")
    model, graph, shapes = bytearray(), None, {}
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
                    if inner == _GRAPH_WEIGHTS[1]:
                        external = _external(stream, field_payload, end, True)
                    else:
                        name, dims, external = _tensor_header(stream, field_payload, end)
                        if name is not None:
                            shapes[name] = dims
                    if external:
                        return OnnxFile("its weights are kept in other files (ONNX external data, "
                                        "used for models over 2 GB), which the workers do not read")
                    continue
                stream.seek(field_start)
                graph += stream.read(end - field_start)
        if graph is None:
            return OnnxFile("it is not an ONNX model file: it holds no graph")
        onnx.ModelProto.FromString(bytes(model))
        parsed = onnx.GraphProto.FromString(bytes(graph))
    except _Malformed as error:
        return OnnxFile(f"it is not an ONNX model file: {error}")
    except DecodeError as error:
        return OnnxFile(f"it is not an ONNX model file ({error})")
    inputs = [i.name for i in parsed.input]
    if "input_ids" not in inputs:
        # the names are the file's text: a few, each cut short (a bad byte leaves a name bytes)
        shown = ", ".join(repr(name)[:40] for name in inputs[:5]) + (", ..." if len(inputs) > 5 else "")
        return OnnxFile(f"its graph takes no input named input_ids (its inputs: {shown or 'none'})")
    if not parsed.output:
        return OnnxFile("its graph has no output")
    return OnnxFile(None, _logits_size(parsed), _embedding(parsed, shapes))
