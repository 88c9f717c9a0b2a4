"""GPTScore's prompts: for each form, the aspects and how a (source, target) pair becomes a
(prefix, target) prompt whose target tokens are scored (transforms/kernels/log_likelihood.py
mean_nll). The wording is part of each metric's definition (GPTScore, Fu et al. 2023, as H2O
Sonar's evaluators #12, #15, #35 and #36 use it), so it is fixed here and versioned: a change of
wording is a new PROMPT_VERSION, which is in every record's parameters and request hash.

Forms (record type: inputs; what is scored):
  GPTScoreTranslation        references, response; both directions, averaged:
                             "Rewrite the following text {aspect}: {a} In other words," + " {b}"
  GPTScoreSummarization      references, response; both directions, averaged:
                             "Rewrite the following text {aspect}. {a} In other words," + " {b}"
  GPTScoreQA                 question, response; the answer "Answer: Yes" after the
                             conversation "human: {question}\\nAI: {response}"
  GPTScoreSummarizationNoReference  question (the source text), response (its summary):
                             "{instruction} for the following text: {source}\\nTl;dr\\n" + response
Lower is better (an average negative log-likelihood, in [0, inf)).
"""

from __future__ import annotations

PROMPT_VERSION = "1"

ASPECTS = {
    "GPTScoreTranslation": {
        "Accuracy": "with its core information and consistent facts",
        "Fluency": "to make it more grammatical and well-written",
        "MultidimensionalQualityMetrics": "into high-quality text with its core information",
    },
    "GPTScoreSummarization": {
        "SemanticCoverage": "with the same semantics",
        "Factuality": "with consistent facts",
        "Informativeness": "with its core information",
        "Coherence": "into a coherent text",
        "Relevance": "with consistent details",
        "Fluency": "into a fluent and grammatical text",
    },
    "GPTScoreQA": {
        "Interest": "interesting",
        "Engagement": "engaging",
        "Understandability": "understandable",
        "Relevance": "relevant to the conversation",
        "Specific": "generic or specific to the conversation",
        "Correctness": "correct to conversations",
        "SemanticallyAppropriate": "semantically appropriate",
        "Fluency": "fluently written",
    },
    "GPTScoreSummarizationNoReference": {
        "SemanticCoverage": "Generate a summary with as much semantic coverage as possible",
        "Factuality": "Generate a summary with consistent facts",
        "Consistency": "Generate factually consistent summary",
        "Informativeness": "Generate informative summary that captures the key points",
        "Coherence": "Generate coherent summary",
        "Relevance": "Generate relevant summary with consistent details",
        "Fluency": "Generate fluent and grammatical summary",
    },
}
FORMS = tuple(ASPECTS)
# the aspect each form reports first (H2O Sonar's primary metric)
PRIMARY = {"GPTScoreTranslation": "Accuracy", "GPTScoreSummarization": "SemanticCoverage",
           "GPTScoreQA": "Interest", "GPTScoreSummarizationNoReference": "SemanticCoverage"}


def rewrite_prompt(form: str, aspect: str, source: str, target: str) -> tuple[str, str]:
    """(prefix, target) of the two reference forms: the target rewrites the source."""
    phrase = ASPECTS[form][aspect]
    colon = ":" if form == "GPTScoreTranslation" else "."
    return f"Rewrite the following text {phrase}{colon} {source} In other words,", f" {target}"


def qa_prompt(aspect: str, question: str, response: str) -> tuple[str, str]:
    phrase = ASPECTS["GPTScoreQA"][aspect]
    prefix = ("Answer the question based on the conversation between a human and AI.\n"
              f"Question: Are the responses of AI {phrase}? (a) Yes. (b) No.\n"
              f"Conversation: human: {question}\nAI: {response}\n")
    return prefix, "Answer: Yes"


def summary_prompt(aspect: str, source: str, summary: str) -> tuple[str, str]:
    instruction = ASPECTS["GPTScoreSummarizationNoReference"][aspect]
    return f"{instruction} for the following text: {source}\nTl;dr\n", summary
