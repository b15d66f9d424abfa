"""Scoring against hand-computed reference vectors, and range properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from surveys.registry import builtin

PERMA = builtin()["perma-profiler"]
DRS = builtin()["decision-regret"]

ANSWERS = {"A1": 8, "E1": 6, "P1": 7, "N1": 3, "A2": 7, "H1": 9, "M1": 8, "R1": 9, "M2": 7, "E2": 6,
           "Lon": 2, "H2": 8, "P2": 8, "N2": 1, "A3": 9, "N3": 2, "E3": 5, "H3": 7, "R2": 10, "M3": 6,
           "R3": 8, "P3": 6, "hap": 7}


def test_perma_has_the_published_structure() -> None:
    assert [i.id for i in PERMA.items] == ["A1", "E1", "P1", "N1", "A2", "H1", "M1", "R1", "M2", "E2", "Lon",
                                           "H2", "P2", "N2", "A3", "N3", "E3", "H3", "R2", "M3", "R3", "P3", "hap"]
    assert PERMA.item("Lon").text == "How lonely do you feel in your daily life?"
    assert {b.id: b.anchors for b in PERMA.blocks}["b2"] == ("0 = terrible", "10 = excellent")


def test_perma_reference_vector() -> None:
    scores = PERMA.score(ANSWERS)
    expected = {"positive_emotion": 7.0, "engagement": 17 / 3, "relationships": 9.0, "meaning": 7.0,
                "accomplishment": 8.0, "negative_emotion": 2.0, "health": 8.0, "loneliness": 2.0,
                "happiness": 7.0, "overall_wellbeing": 117 / 16}
    assert {name: value for name, (value, _, _) in scores.items()} == pytest.approx(expected)
    assert scores["overall_wellbeing"][1:] == (16, 16)


def test_perma_with_skipped_items_uses_answered_ones_and_says_how_many() -> None:
    answers = {k: v for k, v in ANSWERS.items() if k not in {"P3", "M3", "Lon"}}
    clean, problems = PERMA.check_answers(answers, complete=True)
    assert problems == []
    scores = PERMA.score(clean)
    assert scores["positive_emotion"] == pytest.approx((7.5, 2, 3))
    assert scores["meaning"] == pytest.approx((7.5, 2, 3))
    assert scores["overall_wellbeing"] == pytest.approx((105 / 14, 14, 16))
    assert scores["loneliness"] == (None, 0, 1)


@pytest.mark.parametrize(("answers", "regret"), [
    ((2, 4, 1, 5, 2), 15.0),   # reversed items 2 and 4: (25 + 25 + 0 + 0 + 25) / 5
    ((1, 1, 1, 1, 1), 40.0),   # agreeing with everything: 0, 100, 0, 100, 0
    ((1, 5, 1, 5, 1), 0.0),    # no regret at all
    ((5, 1, 5, 1, 5), 100.0),  # full regret
    ((3, 3, 3, 3, 3), 50.0),
])
def test_decision_regret_reference_vectors(answers: tuple[int, ...], regret: float) -> None:
    scores = DRS.score({f"drs{i + 1}": a for i, a in enumerate(answers)})
    assert scores["regret"] == pytest.approx((regret, 5, 5))


def test_decision_regret_pipes_the_decision_and_requires_all_items() -> None:
    assert '"to move to Lisbon". Please' in DRS.pipe(DRS.instructions, {"decision": "to move to Lisbon"})
    # A decision written as a sentence keeps its own punctuation, and the template's full stop goes.
    for decision in ("I'll take the job in Lisbon.", "Quit!", "Should I stay?", "leave it… "):
        piped = DRS.pipe(DRS.instructions, {"decision": decision})
        assert f'"{decision.strip()}" Please' in piped, piped
    assert DRS.pipe("({decision}). {other}", {"decision": "Move."}) == "(Move.) {other}"
    _, problems = DRS.check_answers({"drs1": 2, "drs2": 6, "drs9": 1}, complete=True)
    assert problems == [("drs2", "must be between 1 and 5"), ("drs9", "is not an item of decision-regret"),
                        ("drs3", "is required"), ("drs4", "is required"), ("drs5", "is required")]


perma_answers = st.dictionaries(st.sampled_from([i.id for i in PERMA.items]),
                                st.one_of(st.integers(0, 10), st.floats(0, 10, allow_nan=False)))


@given(perma_answers)
def test_every_perma_score_stays_in_range(answers: dict[str, float]) -> None:
    clean, problems = PERMA.check_answers(answers, complete=True)
    assert problems == []
    for value, n_items, n_expected in PERMA.score(clean).values():
        assert 0 <= n_items <= n_expected
        assert (value is None) == (n_items == 0)
        assert value is None or 0 <= value <= 10


@given(st.lists(st.integers(1, 5), min_size=5, max_size=5))
def test_every_regret_score_stays_in_range(answers: list[int]) -> None:
    value, n_items, _ = DRS.score({f"drs{i + 1}": a for i, a in enumerate(answers)})["regret"]
    assert value is not None
    assert 0 <= value <= 100
    assert n_items == 5


@given(st.integers(-1000, 1000))
def test_out_of_range_answers_are_refused(value: int) -> None:
    _, problems = PERMA.check_answers({"hap": value}, complete=False)
    assert (problems == []) == (0 <= value <= 10)
