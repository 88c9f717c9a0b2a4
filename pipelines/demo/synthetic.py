"""Synthetic classification data: a realistic, reproducible dataset for the demo and benchmarks.

Each datum has one ground-truth value for the label key "class", drawn from a skewed class
distribution, and a metadata field "region" whose value changes how hard the datum is. Each model
scores every class with a softmax over noisy logits; the true class gets a boost that depends on the
model's skill and the region, so models differ and slices differ. A small fraction of datums get no
prediction row at all from a model (they count as misses), and scores are rounded to 6 decimals, as
model exports usually are, which creates ties.
"""

from __future__ import annotations

import json
import os

import numpy as np

REGIONS = ("north", "south", "east", "west")
# how much each region helps (positive) or hurts (negative) every model
REGION_EASE = {"north": 0.6, "south": 0.0, "east": -0.4, "west": 0.2}
ANIMALS = (
    "cat", "dog", "bird", "fish", "horse", "sheep", "cow", "goat", "rabbit", "fox",
    "wolf", "bear", "deer", "mouse", "owl", "frog", "duck", "lion", "tiger", "zebra",
)


def class_names(n_classes: int) -> list[str]:
    """Readable names for up to 20 classes, then class_020, class_021, ..."""
    return [ANIMALS[i] if i < len(ANIMALS) else f"class_{i:03d}" for i in range(n_classes)]


def _softmax_scores(rng: np.random.Generator, truth: np.ndarray, n_classes: int,
                    skill: float, ease: np.ndarray) -> np.ndarray:
    logits = rng.normal(0.0, 1.0, size=(truth.size, n_classes))
    logits[np.arange(truth.size), truth] += skill + ease
    logits -= logits.max(axis=1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(axis=1, keepdims=True)
    return np.round(probs, 6)


def write_classification_dataset(
    folder: str,
    n_datums: int = 5000,
    n_classes: int = 5,
    models: dict[str, float] | None = None,
    seed: int = 0,
    missing_fraction: float = 0.01,
    chunk: int = 100_000,
) -> dict[str, str]:
    """Write groundtruths.jsonl and one predictions file per model into `folder`.

    models maps a model name to its skill (the logit boost of the true class; 0 is chance level).
    Returns {"groundtruths": path, <model>: path, ...}.
    """
    models = models if models is not None else {"model_a": 2.5, "model_b": 1.5}
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    names = class_names(n_classes)
    weights = 1.0 / np.arange(1, n_classes + 1) ** 0.5
    weights /= weights.sum()
    truth = rng.choice(n_classes, size=n_datums, p=weights)
    region = rng.integers(0, len(REGIONS), size=n_datums)
    ease = np.array([REGION_EASE[r] for r in REGIONS])[region]
    uids = [f"img-{i:08d}" for i in range(n_datums)]

    paths = {"groundtruths": os.path.join(folder, "groundtruths.jsonl")}
    with open(paths["groundtruths"], "w", encoding="utf-8") as out:
        for start in range(0, n_datums, chunk):
            stop = min(start + chunk, n_datums)
            out.write("".join(
                json.dumps({
                    "datum_uid": uids[i],
                    "metadata": {"region": REGIONS[region[i]]},
                    "labels": [{"key": "class", "value": names[truth[i]]}],
                }) + "\n"
                for i in range(start, stop)
            ))

    for model, skill in models.items():
        path = os.path.join(folder, f"{model}.jsonl")
        paths[model] = path
        model_rng = np.random.default_rng([seed, len(model), sum(map(ord, model))])
        keep = model_rng.random(n_datums) >= missing_fraction
        with open(path, "w", encoding="utf-8") as out:
            for start in range(0, n_datums, chunk):
                stop = min(start + chunk, n_datums)
                scores = _softmax_scores(model_rng, truth[start:stop], n_classes, skill,
                                         ease[start:stop])
                score_rows = scores.tolist()  # Python floats: repr gives plain JSON numbers
                lines = []
                for row, i in enumerate(range(start, stop)):
                    if not keep[i]:
                        continue
                    labels = ",".join(
                        f'{{"key":"class","value":"{names[c]}","score":{score_rows[row][c]!r}}}'
                        for c in range(n_classes)
                    )
                    lines.append(f'{{"datum_uid":"{uids[i]}","labels":[{labels}]}}\n')
                out.write("".join(lines))
    return paths
