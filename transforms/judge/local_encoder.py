"""A text encoder on the workers, for BERTScore: `--model_uri BERTScore=DIR`. Loading, batching
and failures as every model on the workers (local_models.py).

The folder holds an ONNX export of a BERT-family encoder (`optimum-cli export onnx --model
roberta-large --task feature-extraction DIR`): model.onnx (input input_ids, attention_mask and
token_type_ids when declared; output "last_hidden_state", else the first output, float[B, T, H])
and tokenizer.json (texts cut to 512 tokens). The answer of one text: {"vectors": float32[n, H]}
of its tokens but the special ones ([CLS], [SEP], <s>, </s>), which BERTScore leaves out.
The layer is the export's output: bert-score picks a layer per model (17 of 24 for
roberta-large); export that layer's hidden states for the package's numbers.
"""

from __future__ import annotations

import numpy as np

from evalbeam.transforms.judge.local_models import MAX_TOKENS, BatchedModel, output_named, padded_feeds


def encoder_inference(session, batch, inference_args=None) -> list:
    """(ids, type ids) pairs right-padded into one batch -> each one's hidden states [T, H]."""
    feeds, lengths = padded_feeds(session, batch)
    hidden = session.run([output_named(session, "last_hidden_state")], feeds)[0]
    return [hidden[row, :n] for row, n in enumerate(lengths)]


class LocalEncoder(BatchedModel):
    inference_fn = encoder_inference

    def prepare(self, tokenizer) -> None:
        tokenizer.enable_truncation(MAX_TOKENS)

    def result(self, encoding, output, extra) -> dict:
        keep = np.array(encoding.special_tokens_mask, bool) == 0
        return {"vectors": np.asarray(output)[keep]}

    def empty_result(self) -> dict:     # an empty text without special tokens: no token at all
        return {"vectors": np.zeros((0, 0), np.float32)}
