"""docs/ARCHITECTURE.md's package table is the import rule, read from the source: every import of
one of our packages by another must be listed in the importer's "may import" cell; and no module
of the packages is longer than 700 lines."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["study", "surveys", "chat", "scheduler", "api", "analysis", "evals", "dashboard"]
MAX_LINES = 700


def allowed() -> dict[str, set[str]]:
    """package -> the packages of ours its row's "may import" cell names."""
    rules: dict[str, set[str]] = {}
    for line in (ROOT / "docs" / "ARCHITECTURE.md").read_text().splitlines():
        row = re.match(r"\| `(\w+)/` \|.*\| (.+) \|$", line)
        if row and row.group(1) in PACKAGES:
            cell = row.group(2).split("(")[0]  # what follows in brackets is commentary
            rules[row.group(1)] = set(re.findall(r"`(\w+)`", cell)) & set(PACKAGES)
    return rules


def imported(path: Path) -> set[str]:
    """Our top-level packages a module imports (at any depth: lazy imports count too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names & set(PACKAGES)


def modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def test_the_table_names_every_package() -> None:
    assert set(allowed()) == set(PACKAGES)


def test_imports_follow_the_table() -> None:
    rules = allowed()
    broken = [f"{path.relative_to(ROOT)} imports {other}"
              for package in PACKAGES for path in modules(package)
              for other in sorted(imported(path) - rules[package] - {package})]
    assert not broken, "imports docs/ARCHITECTURE.md does not allow:\n" + "\n".join(broken)


def test_the_rule_catches_a_forbidden_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from api.deps import run_unit\n    import scheduler.planner\n")
    assert imported(module) == {"api", "scheduler"}
    assert "api" not in allowed()["chat"]


def test_no_module_is_longer_than_700_lines() -> None:
    long = [f"{path.relative_to(ROOT)}: {n}" for package in [*PACKAGES, "tests"] for path in modules(package)
            if "node_modules" not in path.parts and (n := len(path.read_text().splitlines())) > MAX_LINES]
    assert not long, "split these along their seams:\n" + "\n".join(long)


def test_no_router_holds_sql() -> None:
    """Routers resolve the caller and call a service; the queries live in the services."""
    statements = re.compile(r"\b(select|insert|update|delete)\(|session\.(execute|scalars?)\(")
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for path in sorted((ROOT / "api" / "routers").glob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1) if statements.search(line)]
    assert not found, "SQL in a router:\n" + "\n".join(found)
