"""Log-likelihood metrics from a language model's token log-probabilities: pure functions.

Input: the prompt's tokens as a completions endpoint echoes them (transforms/judge/client.py
prompt_logprobs): token_logprobs float[n] (None for the first token, which nothing conditions)
and text_offset int[n], the character where each token starts; a token ends where the next one
starts (the last at the prompt's end).

  mean_nll(lp, off, start, length)  average negative log-likelihood (ANLL) of the tokens that
                                    hold at least one character of prompt[start:], i.e. end >
                                    start: -(1/N) sum_i log p(x_i | x_<i); None when no such
                                    token has a log-probability (N = 0).
  perplexity(lp)                    exp(ANLL) over every token that has a log-probability
                                    (all but the first): >= 1, lower is better; None for fewer
                                    than two tokens.
(Per-token log-probabilities of a model on the workers come from the runtime itself:
transforms/judge/local_lm.py appends a log-softmax to the model's graph.)
"""

from __future__ import annotations

import math


def scored_values(token_logprobs: list, text_offset: list, start: int, length: int) -> list[float]:
    """The log-probabilities of the tokens that end after character `start` of a prompt of
    `length` characters (None skipped)."""
    ends = list(text_offset[1:]) + [length]
    return [value for value, end in zip(token_logprobs, ends) if end > start and value is not None]


def mean_nll(token_logprobs: list, text_offset: list, start: int, length: int) -> float | None:
    values = scored_values(token_logprobs, text_offset, start, length)
    if not values:
        return None
    return -math.fsum(values) / len(values)


def perplexity(token_logprobs: list) -> float | None:
    values = [value for value in token_logprobs if value is not None]
    if not values:
        return None
    return math.exp(-math.fsum(values) / len(values))

