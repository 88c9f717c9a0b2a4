"""Synthetic RAG data for `evalbeam text` with judge metrics: questions, references, answers and
retrieved contexts, reproducible from a seed.

Each datum is about one made-up city with a few facts (country, river, founding year, population,
landmark). The question asks for two facts; references state them (sometimes two phrasings);
each model answers with a mix of right facts, wrong facts and unrelated sentences, and retrieves
contexts holding facts of this city or of others. Edge cases on purpose: empty answers, refusals,
no contexts at all (field absent), an empty context list, no references, opinions, and a few
answers in another language.
"""

from __future__ import annotations

import json
import os

import numpy as np

SYLLABLES = ("ka", "lo", "mi", "ra", "ven", "tor", "sa", "bel", "dun", "fi", "mar", "os", "ti", "gra")
RIVERS = ("Amber", "Silt", "Heron", "Willow", "Copper", "Slate", "Reed", "Tern")
LANDMARKS = ("a glass tower", "an old stone bridge", "a floating market", "a salt cathedral",
             "a clock museum", "a lighthouse garden")
COUNTRIES = ("Norland", "Estova", "Kalmaria", "Ruthen", "Palisa", "Verdane")
TOPICS = ("geography", "history")
QUESTIONS = ("in which country is {}", "which river does {} stand on", "when was {} founded",
             "how many people live in {}", "what is {} known for")
OPINIONS = ("Honestly, it is the most boring place anyone could visit.",
            "I think the city council there is doing a wonderful job.",
            "People from that region are always rude to visitors.")


def _city(rng, i: int) -> dict:
    name = "".join(rng.choice(SYLLABLES, size=3)).capitalize() + str(i % 7)
    return {"name": name, "country": COUNTRIES[int(rng.integers(len(COUNTRIES)))],
            "river": RIVERS[int(rng.integers(len(RIVERS)))], "year": int(rng.integers(900, 1900)),
            "population": int(rng.integers(20, 900)) * 1000,
            "landmark": LANDMARKS[int(rng.integers(len(LANDMARKS)))]}


def _facts(city: dict) -> list[str]:
    n = city["name"]
    return [f"{n} lies in {city['country']}.", f"{n} stands on the {city['river']} river.",
            f"{n} was founded in {city['year']}.", f"{n} has about {city['population']:,} inhabitants.",
            f"{n} is known for {city['landmark']}."]


def make_rag_datums(n: int, seed: int = 0, models=("alpha", "beta")):
    """(ground-truth rows, {model: prediction rows}) of n datums."""
    rng = np.random.default_rng(seed)
    cities = [_city(rng, i) for i in range(max(8, n // 4))]
    truths, predictions = [], {m: [] for m in models}
    for i in range(n):
        city = cities[int(rng.integers(len(cities)))]
        facts = _facts(city)
        a, b = sorted(rng.choice(len(facts), size=2, replace=False).tolist())
        asks = [q.format(city["name"]) for q in QUESTIONS]
        row = {"datum_uid": f"d{i:05d}", "query": f"{asks[a][0].upper()}{asks[a][1:]}, and {asks[b]}?",
               "metadata": {"topic": TOPICS[i % 2]}}
        if rng.random() > 0.05:
            refs = [f"{facts[a]} {facts[b]}"]
            if rng.random() < 0.3:
                refs.append(f"{facts[b]} Also, {facts[a][0].lower()}{facts[a][1:]}")
            row["references"] = refs
        truths.append(row)
        for skill, model in zip((0.8, 0.45), models):
            other = _facts(cities[int(rng.integers(len(cities)))])
            answer = [facts[a] if rng.random() < skill else other[a],
                      facts[b] if rng.random() < skill else other[b]]
            if rng.random() < 0.15:
                answer.append(OPINIONS[int(rng.integers(len(OPINIONS)))])
            roll = rng.random()
            response = " ".join(answer)
            if roll < 0.03:
                response = ""
            elif roll < 0.06:
                response = "I'm sorry, I cannot help with that."
            elif roll < 0.08:
                response = f"{city['name']} liegt in {city['country']} und ist bekannt."
            pred = {"datum_uid": row["datum_uid"], "response": response}
            roll = rng.random()
            if roll >= 0.05:       # else: no contexts field at all
                k = int(rng.integers(0, 5)) if roll >= 0.1 else 0
                pool = facts + other
                pred["contexts"] = [pool[int(j)] + " " + pool[int(rng.integers(len(pool)))]
                                    for j in rng.integers(0, len(pool), size=k)]
            predictions[model].append(pred)
    order = rng.permutation(n)
    for model in models:   # prediction files in another order than the ground truth
        predictions[model] = [predictions[model][int(j)] for j in order]
    return truths, predictions


def write_rag_dataset(folder: str, n: int, seed: int = 0, models=("alpha", "beta")) -> dict:
    """Write groundtruths.jsonl and <model>.jsonl under folder; returns their paths."""
    os.makedirs(folder, exist_ok=True)
    truths, predictions = make_rag_datums(n, seed, models)
    paths = {"groundtruths": os.path.join(folder, "groundtruths.jsonl")}
    with open(paths["groundtruths"], "w", encoding="utf-8") as out:
        out.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in truths)
    for model, rows in predictions.items():
        paths[model] = os.path.join(folder, f"{model}.jsonl")
        with open(paths[model], "w", encoding="utf-8") as out:
            out.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    return paths
