"""The README's links work in a fresh clone: every relative link and every `folder/file.md` it names is there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_readme_links_resolve_in_a_clone() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = [target.split("#")[0] for target in re.findall(r"\]\(([^)\s]+)\)", readme)
             if not re.match(r"[a-z]+:", target) and not target.startswith("#")]
    named = re.findall(r"`([\w.-]+/[\w./-]+\.md)`", readme)  # paths in the repository, not file names
    assert "docs/ARCHITECTURE.md" in links
    for target in [*links, *named]:
        assert not target.startswith(".."), f"{target} leaves the repository"
        assert (ROOT / target).is_file(), target
