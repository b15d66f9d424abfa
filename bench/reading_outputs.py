"""The reading's outputs (``chat.semantic.classify``: the crisis verdict and ``chat.reading``'s
scores, flags, ``about`` and quotes) for every message of the multi-label corpus, written to a file
or compared with one written before: a change that should not move the reading (a faster encoding
of the same pieces) is checked with it.

    .venv/bin/python bench/reading_outputs.py --write before.json    # on the code before the change
    .venv/bin/python bench/reading_outputs.py --compare before.json  # after: flags, about, quotes
                                                                     # identical; the largest float gap

Only the training corpus (``chat/crisis_data/multi/*.jsonl``) is read: no held-out round.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from common import ROOT  # first: sets the environment and sys.path

from chat import semantic

MULTI = ROOT / "chat" / "crisis_data" / "multi"


def texts() -> dict[str, str]:
    """Every message of the corpus, by file and id (``corpus_a.jsonl:ca-0001``)."""
    return {f"{path.name}:{item['id']}": item["text"] for path in sorted(MULTI.glob("*.jsonl"))
            for item in map(json.loads, filter(str.strip, path.read_text(encoding="utf-8").splitlines()))}


def output(text: str) -> dict[str, Any]:
    """What the reading of ``text`` gives, as JSON."""
    verdict = semantic.classify(text)
    reading = verdict.reading
    assert reading is not None, "the reading's heads are not fitted"
    return {"score": verdict.score, "category": verdict.category, "acute": verdict.acute, "flagged": verdict.flagged,
            "supports_lexicon": verdict.supports_lexicon, "scores": reading.scores,
            "reading_flagged": sorted(reading.flagged), "about": reading.about,
            "about_scores": reading.about_scores, "quotes": reading.quotes}


def compare(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> tuple[list[str], float]:
    """The differences other than float noise (one line each) and the largest float difference, over
    the messages read both times."""
    exact = ("category", "acute", "flagged", "supports_lexicon", "reading_flagged", "about", "quotes")
    problems: list[str] = []
    largest = 0.0
    for i in before.keys() & after.keys():
        old, new = before[i], after[i]
        problems += [f"{i}: {key} {old[key]!r} -> {new[key]!r}" for key in exact if old[key] != new[key]]
        largest = max([largest, abs(old["score"] - new["score"]),
                       *(abs(old["scores"][c] - new["scores"][c]) for c in old["scores"]),
                       *(abs(old["about_scores"][a] - new["about_scores"][a]) for a in old["about_scores"])])
    return problems, largest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--write", type=Path, metavar="FILE")
    group.add_argument("--compare", type=Path, metavar="FILE")
    args = parser.parse_args()
    outputs = {key: output(text) for key, text in texts().items()}
    if args.write:
        args.write.write_text(json.dumps(outputs) + "\n")
        print(f"{len(outputs)} readings written to {args.write}")
        return
    before = json.loads(args.compare.read_text())
    problems, largest = compare(before, outputs)
    both = before.keys() & outputs.keys()
    quoted = sum(bool(outputs[key]["quotes"]) for key in both)
    print(f"{len(both)} messages read both times ({quoted} with a quote; {len(outputs) - len(both)} new): "
          f"{len(problems)} differences in flags, about or quotes; largest difference of a score or probability "
          f"{largest:.2e}")
    for line in problems[:20]:
        print("  " + line)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
