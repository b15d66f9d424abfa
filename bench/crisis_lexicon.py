"""Recall and false-positive rate of the crisis monitor on the project's message set
(tests/chat/data/crisis_messages.tsv), per split, and its speed against a plain substring check.

    .venv/bin/python bench/crisis_lexicon.py [--classifier MODEL]

'dev' and 'heldout' rows were used while writing the lexicon; 'heldout2' rows were written after
the last change and never tuned on, so they are the honest estimate for new phrasings. With
--classifier, the LLM classifier (through the gateway) is scored on the same rows, alone and
combined with the lexicon as the platform combines them.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import defaultdict

from common import ROOT  # first: sets the environment and sys.path

from chat.monitors import detect_crisis

DATA = ROOT / "tests" / "chat" / "data" / "crisis_messages.tsv"


def load() -> list[tuple[str, str, str]]:
    rows = []
    for line in DATA.read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            split, label, message = line.split("\t")
            rows.append((split, label, message))
    return rows


def score(name: str, rows: list[tuple[str, str, str]], predict: dict[str, str]) -> None:
    groups: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for split, label, message in rows:
        groups[split].append((label, predict[message]))
    groups["all"] = [pair for pairs in list(groups.values()) for pair in pairs]
    print(f"{name}")
    print(f"  {'split':<9} {'crisis':>6} {'benign':>6} {'recall':>7} {'right category':>15} {'false pos.':>10}")
    for split, pairs in groups.items():
        crisis = [(label, got) for label, got in pairs if label != "none"]
        benign = [got for label, got in pairs if label == "none"]
        recall = sum(got != "none" for _, got in crisis) / len(crisis)
        right = sum(got == label for label, got in crisis) / len(crisis)
        false_positive = sum(got != "none" for got in benign) / len(benign)
        print(f"  {split:<9} {len(crisis):>6} {len(benign):>6} {recall:>7.3f} {right:>15.3f} {false_positive:>10.3f}")


def lexicon(message: str) -> str:
    finding = detect_crisis(message)
    return finding.category if finding else "none"


async def classify(model: str, messages: list[str]) -> dict[str, str]:
    from chat.gateway import Gateway
    from study.settings import Settings

    gateway = Gateway(Settings(crisis_classifier_model=model))
    verdicts = await asyncio.gather(*(gateway.classify_crisis(m) for m in messages))
    return {m: (v[0] if v else "none") for m, v in zip(messages, verdicts, strict=True)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--classifier", help="LiteLLM model name of a crisis classifier to score as well")
    args = parser.parse_args()
    rows = load()
    messages = [message for _, _, message in rows]
    score("lexicon (chat.monitors.detect_crisis)", rows, {m: lexicon(m) for m in messages})
    words = ("kill", "die", "suicid", "hurt", "dead", "harm", "revenge")
    naive = {m: ("risk_to_self" if any(w in m.lower() for w in words) else "none") for m in messages}
    score(f"baseline: any of {', '.join(words)}", rows, naive)
    started = time.perf_counter()
    rounds = 200
    for _ in range(rounds):
        for message in messages:
            detect_crisis(message)
    per_message = (time.perf_counter() - started) / (rounds * len(messages)) * 1e6
    started = time.perf_counter()
    for _ in range(rounds):
        for message in messages:
            any(w in message.lower() for w in words)
    naive_us = (time.perf_counter() - started) / (rounds * len(messages)) * 1e6
    print(f"speed: lexicon {per_message:.1f} us/message, substring baseline {naive_us:.1f} us/message")
    if args.classifier:
        verdicts = asyncio.run(classify(args.classifier, messages))
        score(f"classifier {args.classifier}", rows, verdicts)
        combined = {m: lexicon(m) if lexicon(m) != "none" else verdicts[m] for m in messages}
        score("lexicon + classifier", rows, combined)


if __name__ == "__main__":
    main()
