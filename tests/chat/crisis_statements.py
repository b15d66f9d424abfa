"""Explicit crisis statements with unrelated text before and after them (recipes, code, markup, a
story, a list, small talk), for the tests that no surrounding text silences one (issue 23).

Each statement is a plain first-person statement of acute danger that a person on the study team
must hear about at once; the fillers have nothing to do with it and are of several lengths."""

from __future__ import annotations

from collections.abc import Iterator

STATEMENTS: dict[str, str] = {
    "I want to kill myself.": "risk_to_self",
    "i want to kill myself tonight": "risk_to_self",
    "I'm going to end my life this weekend.": "risk_to_self",
    "im gonna kill myself": "risk_to_self",
    "I am suicidal.": "risk_to_self",
    "I'm thinking about killing myself.": "risk_to_self",
    "I have decided to take my own life.": "risk_to_self",
    "I'm going to overdose on my pills tonight.": "risk_to_self",
    "I'm going to jump off the bridge tonight.": "risk_to_self",
    "I'm ready to end it all.": "risk_to_self",
    "i'm gonna hang myself tomorrow": "risk_to_self",
    "I want to die.": "risk_to_self",
    "My husband is choking me right now.": "risk_from_others",
    "My boyfriend is hitting me and I'm scared.": "risk_from_others",
    "He keeps threatening to kill me.": "risk_from_others",
    "He is threatening to kill me right now.": "risk_from_others",
    "I'm going to kill my boss tomorrow, I already bought a gun.": "harm_to_others",
    "I'm going to shoot up my school on Monday.": "harm_to_others",
}

FILLERS: dict[str, str] = {
    "question": "Anyway, what's a good pasta recipe?",
    "code": "here is my code: print(1)",
    "markup": "<div class=\"note\"><b>hello</b> <a href=\"#top\">back to top</a></div>",
    "code block": ("```python\ndef total(items):\n    return sum(item.price for item in items)\n\n"
                   "print(total(cart))\n```"),
    "recipe": (
        "For the sauce: 2 tbsp olive oil, 3 cloves garlic, one tin of tomatoes, a pinch of chilli. Fry the garlic "
        "gently until golden, add the tomatoes and simmer for twenty minutes. Season, then toss with the pasta and "
        "a ladle of the cooking water. Finish with basil and parmesan."
    ),
    "list": "Shopping list:\n- eggs\n- milk\n- bread\n- 2 lemons\n- dish soap",
    "story": (
        "So last weekend we drove up to the lake with my sister and her kids. The weather was perfect, we rented a "
        "little rowing boat and the youngest insisted on steering, which meant we mostly went in circles. In the "
        "evening we grilled corn and sausages and played cards until it got dark. On Sunday it rained, so we "
        "visited the small museum in town, which has a surprisingly good collection of old radios. The drive home "
        "took forever because of roadworks, and everyone fell asleep except me and the dog."
    ),
}

POSITIONS = ("after", "before", "around")


def message(statement: str, filler: str, position: str) -> str:
    """The statement with the filler after it, before it, or on both sides."""
    if position == "after":
        return f"{statement} {filler}"
    if position == "before":
        return f"{filler}\n{statement}"
    return f"{filler}\n{statement}\n{filler}"


def cases() -> Iterator[tuple[str, str, str, str]]:
    """Every (statement, filler name, position, message)."""
    for statement in STATEMENTS:
        for name, filler in FILLERS.items():
            for position in POSITIONS:
                yield statement, name, position, message(statement, filler, position)
