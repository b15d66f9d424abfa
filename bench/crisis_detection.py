"""Recall, false positives and latency of crisis detection: the lexicon, the semantic classifier and
their fusion (what the platform runs), on every labelled set the project has.

    .venv/bin/python bench/crisis_detection.py [--record] [--reader MODEL]

Sets: the classifier's training corpus (``chat/crisis_data/train``, scored by the final head, so
optimistic), the lexicon's earlier rounds (``tests/chat/data/crisis_messages.tsv``) and each
held-out round (``chat/crisis_data/heldout/round*.jsonl``, written by someone who saw only
``CATEGORIES.md``). A held-out round's first scoring is the honest figure: ``--record`` stores it,
once, in ``chat/crisis_data/heldout/first_scores.json`` with the head and lexicon it was scored
with; later runs print it beside the current scores. With ``--reader`` (formerly ``--classifier``)
the LLM reader's danger concerns (``chat.llm_reader``, through the gateway) are scored too, alone
and fused as the platform fuses them.

Latency: each held-out message through ``chat.semantic.detect`` (lexicon, encoder, head; the
verdict cache cleared first), one message at a time, against the lexicon alone in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import statistics
import time
from pathlib import Path

from common import ROOT  # first: sets the environment and sys.path

from chat import semantic
from chat.monitors import detect_crisis

HELDOUT = ROOT / "chat" / "crisis_data" / "heldout"
TRAIN = ROOT / "chat" / "crisis_data" / "train"
EARLIER = ROOT / "tests" / "chat" / "data" / "crisis_messages.tsv"
FIRST_SCORES = HELDOUT / "first_scores.json"
Row = tuple[str, str]  # (label, text)


def jsonl(path: Path) -> list[Row]:
    return [(r["label"], r["text"]) for r in map(json.loads, path.read_text(encoding="utf-8").splitlines()) if r]


def earlier_rounds() -> list[Row]:
    return [(label, text) for split, label, text in
            (line.split("\t") for line in EARLIER.read_text(encoding="utf-8").splitlines()
             if line and not line.startswith("#"))]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def rates(rows: list[Row], flagged: list[bool]) -> dict[str, float | int]:
    crisis = [f for (label, _), f in zip(rows, flagged, strict=True) if label != "none"]
    benign = [f for (label, _), f in zip(rows, flagged, strict=True) if label == "none"]
    return {"crisis": len(crisis), "benign": len(benign),
            "recall": sum(crisis) / len(crisis) if crisis else float("nan"),
            "false_positive": sum(benign) / len(benign) if benign else float("nan")}


def detectors(texts: list[str], llm: dict[str, tuple[str, bool] | None] | None) -> dict[str, dict[str, bool]]:
    """Each detector's flag for each text (the classifier runs once per text)."""
    verdicts = {text: semantic.classify(text) for text in texts}
    lexical = {text: detect_crisis(text) for text in texts}
    found = {
        "lexicon": {t: lexical[t] is not None for t in texts},
        "semantic": {t: verdicts[t].flagged for t in texts},
        "fusion": {t: semantic.detect(t) is not None for t in texts},
    }
    if llm is not None:
        found["llm"] = {t: (llm[t] or ("none", False))[0] != "none" for t in texts}
        found["fusion+llm"] = {t: found["fusion"][t] or found["llm"][t] for t in texts}
    return found


async def llm_verdicts(model: str, texts: list[str]) -> dict[str, tuple[str, bool] | None]:
    from chat.gateway import Gateway
    from chat.llm_reader import danger
    from study.settings import Settings

    gateway = Gateway(Settings(llm_reader_model=model))
    readings = await asyncio.gather(*(gateway.read_message(t) for t in texts))
    return {text: danger(reading.verdict) if reading is not None and reading.verdict is not None else None
            for text, reading in zip(texts, readings, strict=True)}


def latency(texts: list[str]) -> None:
    semantic._recent.clear()
    semantic.detect("warm up the encoder")
    fused, lexical = [], []
    for text in texts:
        semantic._recent.clear()
        start = time.perf_counter()
        semantic.detect(text)
        fused.append((time.perf_counter() - start) * 1000)
        start = time.perf_counter()
        detect_crisis(text)
        lexical.append((time.perf_counter() - start) * 1000)
    words = [len(t.split()) for t in texts]
    def q(values: list[float], p: float) -> float:
        return statistics.quantiles(values, n=100)[int(p) - 1]
    print(f"\nlatency per message, {len(texts)} held-out messages (median {statistics.median(words):.0f} words, "
          f"max {max(words)}), one at a time:")
    print(f"  fusion (lexicon + encoder + head): p50 {statistics.median(fused):.1f} ms, p90 {q(fused, 90):.1f} ms, "
          f"p99 {q(fused, 99):.1f} ms")
    print(f"  baseline, lexicon alone:          p50 {statistics.median(lexical):.3f} ms, "
          f"p90 {q(lexical, 90):.3f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record", action="store_true", help="store the first scoring of rounds not yet scored")
    parser.add_argument("--reader", "--classifier", dest="reader", metavar="MODEL",
                        help="also score this LLM reader's danger concerns (LiteLLM model name)")
    parser.add_argument("--rounds", type=int, nargs="+", metavar="N",
                        help="score only these held-out rounds (keep a newer one sealed for the next model change)")
    parser.add_argument("--no-latency", action="store_true")
    parser.add_argument("--latency-only", action="store_true", help="only the latency, on the held-out messages")
    args = parser.parse_args()

    rounds = sorted(HELDOUT.glob("round*.jsonl"), key=lambda p: int(p.stem.removeprefix("round")))
    if args.rounds:
        rounds = [p for p in rounds if int(p.stem.removeprefix("round")) in args.rounds]
    if args.latency_only:
        latency([text for path in rounds for _, text in jsonl(path)])
        return
    sets: dict[str, list[Row]] = {
        "training corpus (fitted on)": [row for path in sorted(TRAIN.glob("*.jsonl")) for row in jsonl(path)],
        "lexicon rounds (tsv)": earlier_rounds(),
        **{path.stem: jsonl(path) for path in rounds},
    }
    texts = sorted({text for rows in sets.values() for _, text in rows})
    llm = asyncio.run(llm_verdicts(args.reader, texts)) if args.reader else None
    found = detectors(texts, llm)
    head = semantic.head()
    versions = {"head": digest(semantic.HEAD_PATH), "lexicon": digest(ROOT / "chat" / "monitors.py"),
                "threshold": round(head.threshold, 4)}
    print(f"head {versions['head']} (threshold {head.threshold:.3f}, C {head.metadata['C']}, fitted "
          f"{head.metadata['fitted_at']}), lexicon {versions['lexicon']}")
    scores: dict[str, dict[str, dict[str, float | int]]] = {}
    print(f"\n{'set':<28} {'detector':<11} {'crisis':>6} {'benign':>6} {'recall':>7} {'false pos.':>10}")
    for name, rows in sets.items():
        scores[name] = {}
        for detector, flag in found.items():
            result = rates(rows, [flag[text] for _, text in rows])
            scores[name][detector] = result
            print(f"{name:<28} {detector:<11} {result['crisis']:>6} {result['benign']:>6} "
                  f"{result['recall']:>7.3f} {result['false_positive']:>10.3f}")

    recorded = json.loads(FIRST_SCORES.read_text()) if FIRST_SCORES.exists() else {}
    for path in rounds:
        key = f"{path.name} {digest(path)}"
        if key not in recorded and args.record:
            recorded[key] = {"scored_at": time.strftime("%Y-%m-%d"), **versions,
                             "scores": {d: scores[path.stem][d] for d in ("lexicon", "semantic", "fusion")}}
            print(f"\nrecorded the first scoring of {path.name}")
    if args.record:
        FIRST_SCORES.write_text(json.dumps(recorded, indent=2) + "\n")
    if recorded:
        print("\nheld-out rounds as first scored (chat/crisis_data/heldout/first_scores.json):")
        for key, entry in recorded.items():
            for detector, result in entry.get("scores", {}).items():
                print(f"  {key:<30} {detector:<9} recall {result['recall']:.3f}  "
                      f"false pos. {result['false_positive']:.3f}  (head {entry['head']}, {entry['scored_at']})")
    if not args.no_latency:
        latency([text for path in rounds for _, text in jsonl(path)] or texts)


if __name__ == "__main__":
    main()
