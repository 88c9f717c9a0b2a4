"""A causal language model on the workers, for the log-likelihood metrics (Perplexity, the
GPTScore forms) without an endpoint: `--lm_uri DIR`.

The model runs in ONNX Runtime through Beam's RunInference model handler for ONNX
(apache_beam.ml.inference.onnx_inference.OnnxModelHandlerNumpy: it loads the model from any Beam
filesystem, and `Shared` keeps one loaded copy per worker process, whatever the number of DoFn
instances). The judge session (session.py) answers a metric's prompt log-probability request
(requests.logprob_request) from here instead of the endpoint: requests are queued, and all
those queued while the datums of a bundle wait are run together, sorted by length, in batches
of at most `batch_size` right-padded sequences and MAX_BATCH_TOKENS padded tokens (so a batch
pads little and its memory stays bounded).

The model folder holds what an ONNX export of a Hugging Face causal LM holds (for example
`optimum-cli export onnx --model distilgpt2 --task text-generation DIR`):
  model.onnx       input input_ids int64[B, T]; attention_mask and position_ids are fed when the
                   graph declares them; output "logits" (else the first output) float[B, T, V]
  tokenizer.json   a Hugging Face `tokenizers` tokenizer; its special tokens are added as the
                   model was trained (a start token then conditions the first word)
The model is loaded with a log-softmax and the pick of each next token appended to its graph
(with_next_token_logprobs), so the runtime returns one number per token rather than the logits
over the whole vocabulary; token offsets are the tokenizer's character offsets. Models of more
than 2 GB (ONNX external data) are not supported: the handler reads the model as one stream.

A batch that fails in the runtime (a sequence longer than the model's positions, say) is retried
one sequence at a time, and a sequence that still fails gets the status model_error with the
runtime's message: one bad text never stops the run, and the run reports it as a failed datum.
"""

from __future__ import annotations

import asyncio

import numpy as np


MODEL_ERROR = "model_error"
# padded tokens per model call at most: the runtime holds tokens x vocabulary floats twice
# (logits, log-softmax), 2 x 8,192 x 50,257 x 4 bytes = 3.3 GB for GPT-2's vocabulary
MAX_BATCH_TOKENS = 8192
_SHARED = {}   # uri -> beam.utils.shared.Shared, one per process


class ModelError(Exception):
    pass


def missing_runtime() -> str | None:
    """What to install for --lm_uri, or None when ONNX Runtime, onnx and tokenizers import."""
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
        import tokenizers  # noqa: F401
    except ImportError as error:
        return (f"--lm_uri runs the model with ONNX Runtime, which is not installed ({error.name} "
                "is missing): pip install 'evalbeam[models]'")
    return None


NEXT_IDS = "evalbeam_next_ids"
TOKEN_LOGPROBS = "evalbeam_token_logprobs"


def with_next_token_logprobs(model):
    """The model (an onnx ModelProto) with log-softmax over the vocabulary and the pick of each
    next token's entry appended: input NEXT_IDS int64[B, T] (ids shifted left by one), output
    TOKEN_LOGPROBS float[B, T] = log softmax(logits[b, t])[next_ids[b, t]]. The runtime then
    returns B x T numbers instead of B x T x V logits, and computes the log-softmax with its
    own vectorised kernels (float32, within ~1e-7 of float64 at these magnitudes)."""
    from onnx import TensorProto, helper, numpy_helper

    graph = model.graph
    outputs = [o.name for o in graph.output]
    logits = "logits" if "logits" in outputs else outputs[0]
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    graph.input.append(helper.make_tensor_value_info(NEXT_IDS, TensorProto.INT64, ["batch", "sequence"]))
    nodes = [helper.make_node("LogSoftmax", [logits], ["evalbeam_log_softmax"], axis=2)]
    if opset >= 13:   # Unsqueeze and Squeeze take their axes as an input from opset 13 on
        graph.initializer.append(numpy_helper.from_array(np.array([2], np.int64), "evalbeam_axis"))
        nodes += [helper.make_node("Unsqueeze", [NEXT_IDS, "evalbeam_axis"], ["evalbeam_index"]),
                  helper.make_node("GatherElements", ["evalbeam_log_softmax", "evalbeam_index"],
                                   ["evalbeam_picked"], axis=2),
                  helper.make_node("Squeeze", ["evalbeam_picked", "evalbeam_axis"], [TOKEN_LOGPROBS])]
    else:
        nodes += [helper.make_node("Unsqueeze", [NEXT_IDS], ["evalbeam_index"], axes=[2]),
                  helper.make_node("GatherElements", ["evalbeam_log_softmax", "evalbeam_index"],
                                   ["evalbeam_picked"], axis=2),
                  helper.make_node("Squeeze", ["evalbeam_picked"], [TOKEN_LOGPROBS], axes=[2])]
    graph.node.extend(nodes)
    graph.output.append(helper.make_tensor_value_info(TOKEN_LOGPROBS, TensorProto.FLOAT, ["batch", "sequence"]))
    return model


def causal_lm_inference(session, batch, inference_args=None) -> list:
    """The inference function of the ONNX handler: token id arrays of any lengths, right-padded
    into one batch -> each one's next-token log-probabilities, float64[T] with [0] NaN (nothing
    conditions the first token)."""
    lengths = [len(ids) for ids in batch]
    width = max(lengths)
    ids = np.zeros((len(batch), width), np.int64)
    mask = np.zeros((len(batch), width), np.int64)
    for row, sequence in enumerate(batch):
        ids[row, :len(sequence)] = sequence
        mask[row, :len(sequence)] = 1
    declared = {i.name for i in session.get_inputs()}
    feeds = {"input_ids": ids, NEXT_IDS: np.concatenate([ids[:, 1:], np.zeros((len(batch), 1), np.int64)], axis=1)}
    if "attention_mask" in declared:
        feeds["attention_mask"] = mask
    if "position_ids" in declared:
        feeds["position_ids"] = np.maximum(mask.cumsum(axis=1) - 1, 0)
    picked = session.run([TOKEN_LOGPROBS], feeds)[0].astype(np.float64)
    return [np.concatenate([[np.nan], picked[row, :n - 1]]) for row, n in enumerate(lengths)]


def _handler_class():
    from apache_beam.ml.inference.onnx_inference import OnnxModelHandlerNumpy

    class NextTokenHandler(OnnxModelHandlerNumpy):
        """Beam's RunInference handler for ONNX, loading the model with_next_token_logprobs."""

        def load_model(self):
            import onnx
            import onnxruntime
            from apache_beam.io.filesystems import FileSystems

            with FileSystems.open(self._model_uri) as stream:
                model = with_next_token_logprobs(onnx.load(stream))
            return onnxruntime.InferenceSession(model.SerializeToString(),
                                                sess_options=self._session_options,
                                                providers=self._providers)

    return NextTokenHandler


class LocalLM:
    """The model of one --lm_uri in this process, loaded on first use."""

    def __init__(self, uri: str, batch_size: int = 16):
        self.uri = uri.rstrip("/")
        self.batch_size = max(1, int(batch_size))
        self.pending: list = []     # (prompt, future)
        self.loaded = None

    def _load(self):
        if self.loaded is None:
            from apache_beam.io.filesystems import FileSystems
            from apache_beam.utils.shared import Shared
            from tokenizers import Tokenizer
            import onnxruntime

            providers = [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider")
                         if p in onnxruntime.get_available_providers()]
            handler = _handler_class()(FileSystems.join(self.uri, "model.onnx"),
                                       providers=providers, inference_fn=causal_lm_inference)
            shared = _SHARED.setdefault(self.uri, Shared())
            session = shared.acquire(handler.load_model, tag=self.uri)
            with FileSystems.open(FileSystems.join(self.uri, "tokenizer.json")) as stream:
                tokenizer = Tokenizer.from_str(stream.read().decode("utf-8"))
            self.loaded = (handler, session, tokenizer)
        return self.loaded

    async def logprobs(self, prompt: str) -> dict:
        """The prompt's {"tokens", "token_logprobs", "text_offset"} (the first token's None), as
        an endpoint's echo gives them; raises ModelError when the runtime fails on it."""
        future = asyncio.get_running_loop().create_future()
        self.pending.append((prompt, future))
        if len(self.pending) == 1:
            # after every task that is ready now has queued its request
            asyncio.get_running_loop().call_soon(self._flush)
        return await future

    def _flush(self) -> None:
        pending, self.pending = self.pending, []
        try:
            handler, session, tokenizer = self._load()
            encodings = tokenizer.encode_batch([prompt for prompt, _ in pending])
        except Exception as error:   # the model or tokenizer cannot be loaded: every request fails
            for _, future in pending:
                future.set_exception(ModelError(f"{type(error).__name__}: {error}"))
            return
        order = sorted(range(len(pending)), key=lambda i: len(encodings[i].ids))
        for i in order:
            if not encodings[i].ids:
                pending[i][1].set_result({"tokens": [], "token_logprobs": [], "text_offset": []})
        for chunk in batches([i for i in order if encodings[i].ids],
                             [len(encodings[i].ids) for i in order if encodings[i].ids],
                             self.batch_size):
            for i, values in zip(chunk, self._run(handler, session, [encodings[i].ids for i in chunk])):
                encoding, future = encodings[i], pending[i][1]
                if isinstance(values, Exception):
                    future.set_exception(ModelError(f"{type(values).__name__}: {values}"))
                    continue
                future.set_result({
                    "tokens": encoding.tokens,
                    "token_logprobs": [None] + values[1:].tolist(),
                    "text_offset": token_starts(encoding)})

    @staticmethod
    def _run(handler, session, sequences: list) -> list:
        """Each sequence's log-probabilities, or the exception the runtime raised on it alone."""
        if not sequences:
            return []
        batch = [np.asarray(ids, np.int64) for ids in sequences]
        try:
            return [result.inference for result in handler.run_inference(batch, session)]
        except Exception as error:
            if len(batch) == 1:
                return [error]
        out = []
        for one in batch:
            try:
                out.append(list(handler.run_inference([one], session))[0].inference)
            except Exception as error:
                out.append(error)
        return out


def batches(items: list, lengths: list[int], size: int, max_tokens: int = MAX_BATCH_TOKENS) -> list[list]:
    """items (sorted by their lengths, ascending) in batches of at most `size` items and at most
    max_tokens padded tokens (items x the longest length), so that a batch's logits (padded
    tokens x vocabulary floats) stay bounded; an item longer than max_tokens goes alone."""
    out, current = [], []
    for item, length in zip(items, lengths):
        if current and (len(current) == size or (len(current) + 1) * length > max_tokens):
            out.append(current)
            current = []
        current.append(item)
    if current:
        out.append(current)
    return out


def token_starts(encoding) -> list[int]:
    """Each token's first character; a special token added by the tokenizer (offsets (0, 0))
    starts where the token before it ends, so offsets never go back (an end-of-text token
    belongs to the end of the text)."""
    starts, end = [], 0
    for (start, stop), special in zip(encoding.offsets, encoding.special_tokens_mask):
        if special:
            starts.append(end)
            continue
        starts.append(int(start))
        end = max(end, int(stop))
    return starts
