"""A causal language model on the workers, for the log-likelihood metrics (Perplexity, the
GPTScore forms) without an endpoint: `--lm_uri DIR`. Loading, batching and failures as every
model on the workers (local_models.py); this module holds what is particular to a causal LM.

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
The answer of one prompt: {"token_logprobs" (the first None), "text_offset"}, as an endpoint's
echo gives them (without the token strings, which no metric reads: building them cost more
than the rest of the answer).
"""

from __future__ import annotations

import numpy as np

from evalbeam.transforms.judge.local_models import (BatchedModel, ModelError, model_handler_class, padded_feeds,
                                                     read_model)

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
    """The inference function of the handler: (ids, type ids) pairs of any lengths, right-padded
    into one batch -> each one's next-token log-probabilities, float64[T] with [0] NaN (nothing
    conditions the first token)."""
    feeds, lengths = padded_feeds(session, batch)
    ids = feeds["input_ids"]
    feeds[NEXT_IDS] = np.concatenate([ids[:, 1:], np.zeros((len(batch), 1), np.int64)], axis=1)
    picked = session.run([TOKEN_LOGPROBS], feeds)[0].astype(np.float64)
    return [np.concatenate([[np.nan], picked[row, :n - 1]]) for row, n in enumerate(lengths)]


def _handler_class():
    class NextTokenHandler(model_handler_class()):
        """Beam's RunInference handler for ONNX, loading the model (read_model: a regular file,
        size bounded) with_next_token_logprobs."""

        def load_model(self):
            import onnx
            import onnxruntime

            model = with_next_token_logprobs(onnx.load_model_from_string(read_model(self._model_uri)))
            return onnxruntime.InferenceSession(model.SerializeToString(),
                                                sess_options=self._session_options,
                                                providers=self._providers)

    return NextTokenHandler


class LocalLM(BatchedModel):
    """The causal LM of one --lm_uri in this process."""

    inference_fn = causal_lm_inference

    def handler(self, model_path: str, providers: list, options):
        return _handler_class()(model_path, session_options=options, providers=providers,
                                inference_fn=causal_lm_inference)

    def result(self, encoding, output, extra) -> dict:
        if not np.isfinite(output[1:]).all():
            raise ModelError("the model's log-probabilities hold NaN or infinity")
        return {"token_logprobs": [None] + output[1:].tolist(),
                "text_offset": token_starts(encoding)}

    def empty_result(self) -> dict:
        return {"token_logprobs": [], "text_offset": []}


def token_starts(encoding) -> list[int]:
    """Each token's first character; a special token added by the tokenizer (offsets (0, 0))
    starts where the token before it ends, so offsets never go back (an end-of-text token
    belongs to the end of the text)."""
    offsets = encoding.offsets
    starts = [start for start, _ in offsets]
    mask = encoding.special_tokens_mask
    # special tokens before the first word (a start token) start at 0, as their offsets say:
    # only one after a word needs its start moved (the usual case needs no loop at all)
    first = mask.index(0) if 0 in mask else len(mask)
    if 1 not in mask[first:]:
        return starts
    end = 0
    for i in range(first, len(mask)):
        if mask[i]:
            starts[i] = end
        else:
            end = max(end, offsets[i][1])
    return starts
