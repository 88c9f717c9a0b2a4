"""A text encoder on the workers, for BERTScore: `--model_uri BERTScore=DIR`. Loading, batching
and failures as every model on the workers (local_models.py).

The folder holds an ONNX export of a BERT-family encoder (`optimum-cli export onnx --model
roberta-large --task feature-extraction DIR`): model.onnx (input input_ids, attention_mask and
token_type_ids when declared; output "last_hidden_state", else the first output, float[B, T, H])
and tokenizer.json (texts cut to 512 tokens). The answer of one text: {"vectors": float32[n, H],
"ids": int64[n], "special": bool[n]} of all its tokens, the special ones ([CLS], [SEP], <s>,
</s>) marked: BERTScore never averages them but lets them be a word's best match, as bert-score
does (kernels/bertscore.py). As bert-score does, a text is stripped first, and a byte-level BPE
tokenizer (RoBERTa's, GPT-2's) gets a leading space, so the first word is tokenized as every
other. reference_counts() counts the references' token ids for BERTScore's idf weights with
the same tokenizer (same cut; special tokens left out: they weigh 0).
The layer is the export's output: bert-score picks a layer per model (17 of 24 for
roberta-large); export that layer's hidden states for the package's numbers.
"""

from __future__ import annotations

import numpy as np

from evalbeam.transforms.judge.local_models import (MAX_TOKENS, BatchedModel, ModelError, output_named,
                                                     padded_feeds, read_tokenizer)


def encoder_inference(session, batch, inference_args=None) -> list:
    """(ids, type ids) pairs right-padded into one batch -> each one's hidden states [T, H]."""
    feeds, lengths = padded_feeds(session, batch)
    hidden = session.run([output_named(session, "last_hidden_state")], feeds)[0]
    return [hidden[row, :n] for row, n in enumerate(lengths)]


def byte_level(tokenizer) -> bool:
    """Whether the tokenizer's pre-tokenizer is byte-level BPE (RoBERTa, GPT-2), alone or in a
    sequence."""
    import json

    def walk(node) -> bool:
        if not isinstance(node, dict):
            return False
        return node.get("type") == "ByteLevel" or any(walk(n) for n in node.get("pretokenizers") or [])

    return walk(json.loads(tokenizer.to_str()).get("pre_tokenizer"))


def bert_score_text(text: str, prefix_space: bool) -> str:
    """The text as bert-score encodes it: stripped, and with a leading space for a byte-level
    tokenizer (its add_prefix_space=True), so the first word is tokenized as every other."""
    text = text.strip()
    return " " + text if prefix_space and text else text


class LocalEncoder(BatchedModel):
    inference_fn = encoder_inference

    def prepare(self, tokenizer) -> None:
        tokenizer.enable_truncation(MAX_TOKENS)
        self.prefix_space = byte_level(tokenizer)

    def encoded_text(self, text):
        return bert_score_text(text, self.prefix_space)

    def result(self, encoding, output, extra) -> dict:
        output = np.asarray(output)
        if output.ndim != 2 or len(output) != len(encoding.ids):
            raise ModelError(f"the encoder gives an output of shape {list(output.shape)} for "
                             f"{len(encoding.ids)} tokens, not one vector per token (is it a "
                             "feature-extraction export?)")
        if not np.isfinite(output).all():
            raise ModelError("the encoder's vectors hold NaN or infinity")
        return {"vectors": output, "ids": np.asarray(encoding.ids, np.int64),
                "special": np.array(encoding.special_tokens_mask, bool)}

    def empty_result(self) -> dict:     # an empty text without special tokens: no token at all
        return {"vectors": np.zeros((0, 0), np.float32), "ids": np.zeros(0, np.int64),
                "special": np.zeros(0, bool)}


_TOKENIZERS: dict = {}      # encoder folder -> (its tokenizer as LocalEncoder prepares it, prefix space)


def _tokenizer(uri: str):
    if uri not in _TOKENIZERS:
        tokenizer = read_tokenizer(uri)
        tokenizer.enable_truncation(MAX_TOKENS)
        _TOKENIZERS[uri] = (tokenizer, byte_level(tokenizer))
    return _TOKENIZERS[uri]


def reference_counts(uri: str, references: list[str]) -> tuple[int, dict]:
    """(len(references), {token id: how many references hold it}) under the encoder's
    tokenizer, special tokens left out: one part of BERTScore's idf table
    (kernels.bertscore.add_counts sums the parts)."""
    df: dict = {}
    if references:
        tokenizer, prefix_space = _tokenizer(uri)
        for encoding in tokenizer.encode_batch([bert_score_text(r, prefix_space) for r in references]):
            for token, special in set(zip(encoding.ids, encoding.special_tokens_mask)):
                if not special:
                    df[token] = df.get(token, 0) + 1
    return len(references), df
