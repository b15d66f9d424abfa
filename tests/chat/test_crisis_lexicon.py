from __future__ import annotations

from pathlib import Path

from chat.monitors import detect_crisis

DATA = Path(__file__).parent / "data" / "crisis_messages.tsv"


def load(splits: set[str]) -> list[tuple[str, str]]:
    rows = []
    for line in DATA.read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            split, label, message = line.split("\t")
            if split in splits:
                rows.append((label, message))
    return rows


def test_the_lexicon_meets_its_targets_on_the_sets_it_was_written_against() -> None:
    """A regression floor, not a validation: bench/crisis_detection.py also reports the untuned rounds."""
    rows = load({"dev", "heldout", "heldout2"})
    crisis = [(label, m) for label, m in rows if label != "none"]
    benign = [m for label, m in rows if label == "none"]
    assert len(rows) >= 100
    found = [(label, detect_crisis(m)) for label, m in crisis]
    recall = sum(f is not None and f.category == label for label, f in found) / len(crisis)
    false_positive_rate = sum(detect_crisis(m) is not None for m in benign) / len(benign)
    assert recall >= 0.95
    assert false_positive_rate <= 0.05


def test_idioms_are_not_crises_but_plain_statements_are() -> None:
    assert detect_crisis("This deadline is killing me") is None
    assert detect_crisis("I could kill for a coffee") is None
    finding = detect_crisis("honestly this deadline is killing me and I want to kill myself")
    assert finding is not None
    assert (finding.category, finding.acute, finding.cue) == ("risk_to_self", True, "i want to kill myself")
    assert finding.explicit
    other = detect_crisis("I\u2019m going to hurt him")
    assert other is not None
    assert (other.category, other.acute) == ("harm_to_others", True)
