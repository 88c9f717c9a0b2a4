"""Models on the workers: what the causal LM (local_lm.py), the classifiers (local_classifier.py)
and the encoder (local_encoder.py) share.

Each model runs in ONNX Runtime through Beam's RunInference model handler for ONNX
(apache_beam.ml.inference.onnx_inference.OnnxModelHandlerNumpy, subclassed so that model.onnx
is read through transforms.input_files as every file of the folder is: read_model,
read_tokenizer), from any Beam filesystem, and `Shared` keeps one loaded copy per worker process
whatever the number of DoFn instances. The judge session (session.py) hands a model the requests of its
kind. A request is queued, and every request queued while the datums of a bundle wait is run
together: sorted by length, in right-padded batches of at most `batch_size` texts and
MAX_BATCH_TOKENS padded tokens (batches()). A batch the runtime refuses is retried one text at a
time, and a text that still fails raises ModelError, which the session turns into the datum's
status model_error: one bad text never stops the run. A text of more than MAX_BATCH_TOKENS
tokens (after a classifier's or encoder's cut to MAX_TOKENS) is not run at all: model_error,
so one hostile text cannot ask for unbounded memory.
"""

from __future__ import annotations

import asyncio

import numpy as np

MODEL_ERROR = "model_error"
# padded tokens per model call at most: the runtime may hold tokens x vocabulary floats twice
# (a causal LM's logits and log-softmax), 2 x 8,192 x 50,257 x 4 bytes = 3.3 GB for GPT-2
MAX_BATCH_TOKENS = 8192
MAX_TOKENS = 512            # classifiers and encoders read at most this many tokens of a text
_SHARED: dict = {}          # model folder -> beam.utils.shared.Shared, one per process


class ModelError(Exception):
    pass


def missing_runtime(option: str = "--lm_uri") -> str | None:
    """What to install for a model on the workers, or None when ONNX Runtime, onnx and
    tokenizers import."""
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
        import tokenizers  # noqa: F401
    except ImportError as error:
        return (f"{option} runs the model with ONNX Runtime, which is not installed ({error.name} "
                "is missing): pip install 'evalbeam[models]'")
    return None


def batches(items: list, lengths: list[int], size: int, max_tokens: int = MAX_BATCH_TOKENS) -> list[list]:
    """items (sorted by their lengths, ascending) in batches of at most `size` items and at most
    max_tokens padded tokens (items x the longest length), so that a batch's memory stays
    bounded; an item longer than max_tokens goes alone."""
    out, current = [], []
    for item, length in zip(items, lengths):
        if current and (len(current) == size or (len(current) + 1) * length > max_tokens):
            out.append(current)
            current = []
        current.append(item)
    if current:
        out.append(current)
    return out


def padded_feeds(session, batch: list) -> tuple[dict, list[int]]:
    """(feeds, lengths) of (ids, type ids) int arrays right-padded into one batch: input_ids,
    and attention_mask, token_type_ids and position_ids when the graph declares them."""
    lengths = [len(ids) for ids, _ in batch]
    width = max(lengths)
    ids = np.zeros((len(batch), width), np.int64)
    types = np.zeros((len(batch), width), np.int64)
    mask = np.zeros((len(batch), width), np.int64)
    for row, (sequence, type_ids) in enumerate(batch):
        ids[row, :len(sequence)] = sequence
        types[row, :len(sequence)] = type_ids
        mask[row, :len(sequence)] = 1
    declared = {i.name for i in session.get_inputs()}
    feeds = {"input_ids": ids}
    if "attention_mask" in declared:
        feeds["attention_mask"] = mask
    if "token_type_ids" in declared:
        feeds["token_type_ids"] = types
    if "position_ids" in declared:
        feeds["position_ids"] = np.maximum(mask.cumsum(axis=1) - 1, 0)
    return feeds, lengths


def read_tokenizer(uri: str, what: str | None = None):
    """The `tokenizers` tokenizer of a model folder (tokenizer.json, any Beam filesystem),
    without padding: texts are padded into batches by padded_feeds. The file is read through
    transforms.input_files (a regular file of at most MAX_TOKENIZER_BYTES, strict UTF-8), on the
    launcher and on the workers alike; FileRefused (what: the file's name in its message)
    otherwise. A file that is no tokenizer raises the tokenizers library's plain Exception."""
    from apache_beam.io.filesystems import FileSystems
    from tokenizers import Tokenizer

    from evalbeam.transforms.input_files import MAX_TOKENIZER_BYTES, decode_text, read_bytes

    path = FileSystems.join(uri.rstrip("/"), "tokenizer.json")
    what = what or path
    tokenizer = Tokenizer.from_str(decode_text(read_bytes(path, MAX_TOKENIZER_BYTES, what), what))
    tokenizer.no_padding()
    return tokenizer


def tokenizer_size(tokenizer) -> tuple[int, str | None]:
    """(its largest token id + 1, that token) over the vocabulary and the added tokens: the ids
    a model must take, (0, None) for a tokenizer without tokens."""
    vocabulary = tokenizer.get_vocab(with_added_tokens=True)
    if not vocabulary:
        return 0, None
    token, largest = max(vocabulary.items(), key=lambda item: item[1])
    return largest + 1, token


def read_model(path: str, what: str | None = None) -> bytes:
    """The bytes of model.onnx, read through transforms.input_files: a regular file (or an
    object) of at most MAX_MODEL_BYTES, FileRefused otherwise. Beam's handler would open any
    path and read it whole: a FIFO would block a worker forever and /dev/zero never end."""
    from evalbeam.transforms.input_files import MAX_MODEL_BYTES, read_bytes

    return read_bytes(path, MAX_MODEL_BYTES, what)


def model_handler_class():
    """Beam's RunInference handler for ONNX, loading model.onnx through read_model."""
    from apache_beam.ml.inference.onnx_inference import OnnxModelHandlerNumpy

    class ModelFileHandler(OnnxModelHandlerNumpy):
        def load_model(self):
            import onnxruntime

            return onnxruntime.InferenceSession(read_model(self._model_uri),
                                                sess_options=self._session_options,
                                                providers=self._providers,
                                                provider_options=self._provider_options)

    return ModelFileHandler


def output_named(session, name: str) -> str:
    """`name` if the graph has that output, else its first output."""
    outputs = [o.name for o in session.get_outputs()]
    return name if name in outputs else outputs[0]


class BatchedModel:
    """One model folder in this process, loaded on first use; requests batched as the module
    docstring says. A subclass sets `inference_fn` (the handler's, of (ids, type ids) pairs)
    and defines result(encoding, output) and empty_result() (a text without tokens), and may
    override handler(), prepare(tokenizer) and extra()."""

    inference_fn = None

    def __init__(self, uri: str, batch_size: int = 128, threads: int | None = None):
        self.uri = uri.rstrip("/")
        self.batch_size = max(1, int(batch_size))
        self.threads = threads      # ONNX Runtime's intra-op threads; None: its own choice
        self.pending: list = []     # (text or (text, pair), future)
        self.loaded = None

    def handler(self, model_path: str, providers: list, options):
        return model_handler_class()(model_path, session_options=options, providers=providers,
                                     inference_fn=type(self).inference_fn)

    def prepare(self, tokenizer) -> None:
        """Truncation and the like, before any text is encoded."""

    def encoded_text(self, text):
        """The text (or (text, pair)) as the tokenizer is given it."""
        return text

    def extra(self):
        """What result() needs besides the model (a classifier's labels)."""
        return None

    def _load(self):
        if self.loaded is None:
            from apache_beam.io.filesystems import FileSystems
            from apache_beam.utils.shared import Shared
            import onnxruntime

            providers = [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider")
                         if p in onnxruntime.get_available_providers()]
            # the runtime's own error lines (one per text it refuses) would repeat what each
            # datum's model_error already says: fatal messages only
            onnxruntime.set_default_logger_severity(4)
            options = onnxruntime.SessionOptions()
            if self.threads:
                options.intra_op_num_threads = self.threads
            handler = self.handler(FileSystems.join(self.uri, "model.onnx"), providers, options)
            session = _SHARED.setdefault(self.uri, Shared()).acquire(handler.load_model, tag=self.uri)
            tokenizer = read_tokenizer(self.uri)
            self.prepare(tokenizer)
            self.loaded = (handler, session, tokenizer, self.extra())
        return self.loaded

    async def ask(self, text):
        """The model's answer for one text (or (text, pair)); raises ModelError."""
        future = asyncio.get_running_loop().create_future()
        self.pending.append((text, future))
        if len(self.pending) == 1:
            # after every task that is ready now has queued its request
            asyncio.get_running_loop().call_soon(self._flush)
        return await future

    def _flush(self) -> None:
        pending, self.pending = self.pending, []
        try:
            handler, session, tokenizer, extra = self._load()
            encodings = tokenizer.encode_batch([self.encoded_text(text) for text, _ in pending])
        except Exception as error:   # the model or tokenizer cannot be loaded: every request fails
            for _, future in pending:
                future.set_exception(ModelError(f"{type(error).__name__}: {error}"))
            return
        for (_, future), encoding in zip(pending, encodings):
            if not encoding.ids:
                future.set_result(self.empty_result())
            elif len(encoding.ids) > MAX_BATCH_TOKENS:   # bounded memory: never run, never cut
                future.set_exception(ModelError(
                    f"{len(encoding.ids):,} tokens, more than the {MAX_BATCH_TOKENS:,} a model call holds"))
        order = sorted((i for i, e in enumerate(encodings) if 0 < len(e.ids) <= MAX_BATCH_TOKENS),
                       key=lambda i: len(encodings[i].ids))
        for chunk in batches(order, [len(encodings[i].ids) for i in order], self.batch_size):
            examples = [(np.asarray(encodings[i].ids, np.int64), np.asarray(encodings[i].type_ids, np.int64))
                        for i in chunk]
            for i, output in zip(chunk, run_each(handler, session, examples)):
                future = pending[i][1]
                if isinstance(output, Exception):
                    future.set_exception(ModelError(f"{type(output).__name__}: {output}"))
                    continue
                try:
                    future.set_result(self.result(encodings[i], output, extra))
                except ModelError as error:     # an output of the wrong shape, NaN: this text only
                    future.set_exception(error)

    def result(self, encoding, output, extra) -> dict:
        raise NotImplementedError

    def empty_result(self) -> dict:
        raise NotImplementedError


def run_each(handler, session, examples: list) -> list:
    """Each example's output, or the exception the runtime raised on it alone."""
    try:
        return [result.inference for result in handler.run_inference(examples, session)]
    except Exception as error:
        if len(examples) == 1:
            return [error]
    out = []
    for one in examples:
        try:
            out.append(list(handler.run_inference([one], session))[0].inference)
        except Exception as error:
            out.append(error)
    return out
