from __future__ import annotations

from collections import Counter

from study.participants import allocate
from study.protocol import Arm

ARMS = [Arm(name="wellbeing", mode="wellbeing", roles=["coach"], default_role="coach", weight=2),
        Arm(name="control", mode="default", weight=1)]


def test_every_block_is_balanced_by_weight() -> None:
    block_size = 6  # (2 + 1) * 2
    for block in range(50):
        arms = [allocate("seed", block * block_size + i, ARMS)[0] for i in range(block_size)]
        assert Counter(arms) == {"wellbeing": 4, "control": 2}


def test_sequence_is_reproducible_from_seed_and_differs_between_seeds() -> None:
    first = [allocate("seed-a", i, ARMS)[0] for i in range(60)]
    assert first == [allocate("seed-a", i, ARMS)[0] for i in range(60)]
    assert first != [allocate("seed-b", i, ARMS)[0] for i in range(60)]


def test_order_within_blocks_varies() -> None:
    blocks = {tuple(allocate("seed", b * 6 + i, ARMS)[0] for i in range(6)) for b in range(30)}
    assert len(blocks) > 3
