"""Text classifiers on the workers, for the classifier metrics (ToxicityClassifier, FairnessBias,
HHEM): `--model_uri METRIC=DIR`. Loading, batching and failures as every model on the workers
(local_models.py); this module holds what is particular to a classifier.

The model folder holds what an ONNX export of a Hugging Face sequence classifier holds
(`optimum-cli export onnx --model unitary/toxic-bert --task text-classification DIR`):
  model.onnx       inputs input_ids int64[B, T] (attention_mask and token_type_ids fed when
                   declared), output "logits" (else the first output) float[B, L], or
                   float[B, T, L] of a token-classification head, of which the first token's
                   logits are read (HHEM-2.1-Open's T5 head is read that way)
  tokenizer.json   its tokenizer; texts are cut to MAX_TOKENS tokens (512, as BERT-family
                   classifiers are trained), a pair (context, answer) is encoded as a pair
  config.json      id2label (label names; LABEL_i when absent) and problem_type:
                   "multi_label_classification" gives each label's sigmoid, anything else the
                   softmax over the labels; a model with one output gives its sigmoid. A
                   "prompt" holding {text1} and {text2} (HHEM-2.1-Open's config has one) turns
                   a pair into that one text, context for {text1}, answer for {text2}, instead
                   (each once, in at most MAX_PROMPT_CHARS; label names must differ).
A model whose output does not give one finite score per label of config.json fails the text
(model_error), never a score under the wrong label.
The answer of one text: {"labels": [name], "probabilities": [float]}.
"""

from __future__ import annotations

import re

import numpy as np

from evalbeam.transforms.judge.local_models import MAX_TOKENS, BatchedModel, ModelError, output_named, padded_feeds


PAIR_FIELDS = re.compile(r"\{text[12]\}")
MAX_PROMPT_CHARS = 4096     # HHEM-2.1-Open's prompt is under 100


def read_config(uri: str, what: str | None = None) -> dict:
    """{"labels": [names in index order], "multi_label": bool, "prompt": str or None} of a model
    folder's config.json, read through transforms.input_files (a regular file of at most
    MAX_SETTINGS_BYTES, strict JSON; FileRefused otherwise, `what` naming it), on the launcher
    and on the workers alike."""
    from apache_beam.io.filesystems import FileSystems

    from evalbeam.transforms.input_files import MAX_SETTINGS_BYTES, load_json

    config = load_json(FileSystems.join(uri.rstrip("/"), "config.json"), MAX_SETTINGS_BYTES, what)
    if not isinstance(config, dict):
        raise ValueError("it is not a JSON object")
    id2label = config.get("id2label") or {}
    size = len(id2label) or int(config.get("num_labels", 1))
    labels = [str(id2label.get(str(i), id2label.get(i, f"LABEL_{i}"))) for i in range(size)]
    if len(set(labels)) != len(labels):
        raise ValueError(f"id2label names a label twice ({', '.join(labels)}): each label is one record")
    prompt = config.get("prompt")
    if not (isinstance(prompt, str) and "{text1}" in prompt and "{text2}" in prompt):
        prompt = None
    elif prompt.count("{text1}") != 1 or prompt.count("{text2}") != 1 or len(prompt) > MAX_PROMPT_CHARS:
        # each text is filled in once: a prompt repeating them would multiply every pair's size
        raise ValueError(f"its prompt must hold {{text1}} and {{text2}} once each, in at most "
                         f"{MAX_PROMPT_CHARS:,} characters")
    return {"labels": labels, "multi_label": config.get("problem_type") == "multi_label_classification",
            "prompt": prompt}


def pair_text(prompt: str, text1: str, text2: str) -> str:
    """The prompt with {text1} and {text2} filled in one pass (braces in the texts stay as they
    are)."""
    return PAIR_FIELDS.sub(lambda m: text1 if m.group(0) == "{text1}" else text2, prompt)


def probabilities(logits: np.ndarray, multi_label: bool) -> np.ndarray:
    """float64[B, L] probabilities of logits float[B, L]: sigmoid per label when multi_label or
    L == 1, else the softmax over the labels."""
    logits = np.asarray(logits, dtype=np.float64)
    if multi_label or logits.shape[1] == 1:
        with np.errstate(over="ignore"):    # exp(800) is inf and the sigmoid 0, as it should be
            return 1.0 / (1.0 + np.exp(-logits))
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def classifier_inference(session, batch, inference_args=None) -> list:
    """(ids, type ids) pairs right-padded into one batch -> each one's logits float[L]."""
    feeds, _ = padded_feeds(session, batch)
    logits = np.asarray(session.run([output_named(session, "logits")], feeds)[0])
    if logits.ndim == 3:    # a token-classification head: the first token's logits
        logits = logits[:, 0, :]
    return list(logits.reshape(len(batch), -1))


class LocalClassifier(BatchedModel):
    inference_fn = classifier_inference

    def prepare(self, tokenizer) -> None:
        tokenizer.enable_truncation(MAX_TOKENS)

    def extra(self):
        return read_config(self.uri)

    def encoded_text(self, text):
        prompt = self.loaded[3]["prompt"]
        if prompt is not None and isinstance(text, tuple):
            return pair_text(prompt, *text)
        return text

    def result(self, encoding, output, config) -> dict:
        logits = np.asarray(output, dtype=np.float64).reshape(1, -1)
        if logits.shape[1] != len(config["labels"]):
            raise ModelError(f"the model gives {logits.shape[1]} score(s) per text, config.json names "
                             f"{len(config['labels'])} label(s): not the model the config describes")
        if not np.isfinite(logits).all():
            raise ModelError("the model's logits hold NaN or infinity")
        return {"labels": config["labels"], "probabilities": probabilities(logits, config["multi_label"])[0].tolist()}

    def empty_result(self) -> dict:     # never: the tokenizer adds its special tokens
        raise ValueError("a text without any token")
