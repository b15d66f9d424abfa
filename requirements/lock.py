"""The dependency locks of requirements/: every release pinned with its hashes, made by uv from pyproject.toml.

    python requirements/lock.py compile            # after editing dependencies (make lock); keeps the pins it can
    python requirements/lock.py compile --upgrade  # move every pin to the newest release allowed
    python requirements/lock.py check              # CI: exit 1 when a lock and pyproject.toml disagree
    python requirements/lock.py check --offline    # only the checks that need no package index

``runtime.txt`` is what the Dockerfile installs, ``dev.txt`` (runtime plus the ``dev`` and ``duckdb`` extras, held
to the runtime pins) what ``make`` installs, ``extra.txt`` (from ``extra.in``, without dependencies) goes beside both.
"""

from __future__ import annotations

import argparse
import difflib
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

ROOT = Path(__file__).resolve().parent.parent
PYTHON = "3.11"  # the oldest Python of pyproject.toml's requires-python; the locks hold for newer ones too
COMMON = ["--universal", "--python-version", PYTHON, "--generate-hashes", "--custom-compile-command", "make lock",
          "--quiet"]


@dataclass(frozen=True)
class Lock:
    path: str  # relative to the repository root
    sources: tuple[str, ...]  # uv's arguments naming what is locked
    extras: tuple[str, ...] = ()  # pyproject.toml's optional dependencies included


LOCKS = (
    Lock("requirements/runtime.txt", ("pyproject.toml",)),
    Lock("requirements/dev.txt", ("pyproject.toml", "--extra", "dev", "--extra", "duckdb", "-c",
                                  "requirements/runtime.txt"), ("dev", "duckdb")),
    Lock("requirements/extra.txt", ("requirements/extra.in", "--no-deps")),
)


@dataclass(frozen=True)
class Pin:
    version: str
    marker: str
    hashes: int


PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^\s;\\]+)\s*(?:;(?P<marker>[^\\]*))?\\?\s*$")


def read_pins(text: str) -> dict[str, list[Pin]]:
    """The pins of a lock file by canonical name (a name may be pinned twice under exclusive markers)."""
    pins: dict[str, list[Pin]] = {}
    current: tuple[str, str, str] | None = None
    hashes = 0

    def close() -> None:
        if current is not None:
            name, version, marker = current
            pins.setdefault(name, []).append(Pin(version, marker, hashes))

    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line[0].isspace():
            hashes += line.count("--hash=")
            continue
        close()
        match = PIN.match(line)
        if match is None:
            raise ValueError(f"not a pinned requirement: {line.strip()!r}")
        current = (canonicalize_name(match["name"]), match["version"], (match["marker"] or "").strip())
        hashes = line.count("--hash=")
    close()
    return pins


def declared(root: Path, lock: Lock) -> list[Requirement]:
    """What a lock must satisfy: pyproject.toml's dependencies (and extras), or the lines of an ``.in`` file."""
    if "pyproject.toml" in lock.sources:
        project = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]
        lines = [*project.get("dependencies", [])]
        for extra in lock.extras:
            lines += project.get("optional-dependencies", {}).get(extra, [])
    else:
        source = next(s for s in lock.sources if s.endswith(".in"))
        lines = [line.split("#")[0].strip() for line in (root / source).read_text(encoding="utf-8").splitlines()]
    return [Requirement(line) for line in lines if line]


def offline_problems(root: Path) -> list[str]:
    """Disagreements found without a package index: a declared requirement no pin satisfies, a pin without a
    hash, a package pinned differently in the runtime and development locks."""
    problems: list[str] = []
    locked: dict[str, dict[str, list[Pin]]] = {}
    for lock in LOCKS:
        path = root / lock.path
        if not path.is_file():
            problems.append(f"{lock.path} is missing")
            continue
        try:
            pins = locked[lock.path] = read_pins(path.read_text(encoding="utf-8"))
            requirements = declared(root, lock)
        except (ValueError, InvalidRequirement) as exc:
            problems.append(f"{lock.path}: {exc}")
            continue
        for requirement in requirements:
            found = pins.get(canonicalize_name(requirement.name), [])
            if not found:
                problems.append(f"{lock.path}: {requirement} is declared but not locked")
            elif not any(_satisfies(requirement, pin.version) for pin in found):
                versions = ", ".join(pin.version for pin in found)
                problems.append(f"{lock.path}: {requirement} is declared but {versions} is locked")
        problems += [f"{lock.path}: {name}=={pin.version} has no hash" for name, found in pins.items()
                     for pin in found if pin.hashes == 0]
    runtime, dev = locked.get(LOCKS[0].path, {}), locked.get(LOCKS[1].path, {})
    for name, found in runtime.items():
        if name in dev and {p.version for p in found} != {p.version for p in dev[name]}:
            problems.append(f"{name} is locked at {', '.join(p.version for p in found)} in {LOCKS[0].path} but "
                            f"{', '.join(p.version for p in dev[name])} in {LOCKS[1].path}")
    return problems


def _satisfies(requirement: Requirement, version: str) -> bool:
    try:
        return requirement.specifier.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def uv_binary() -> str:
    beside = Path(sys.executable).with_name("uv")  # the dev dependency in the virtual environment
    found = str(beside) if beside.is_file() else shutil.which("uv")
    if found is None:
        raise SystemExit("uv is not installed: it is a dev dependency (make installs it into .venv)")
    return found


def compile_lock(root: Path, lock: Lock, output: Path, upgrade: bool = False) -> None:
    """Run uv for one lock into ``output``; the pins already in ``output`` are kept where they still fit."""
    command = [uv_binary(), "pip", "compile", *lock.sources, *COMMON, *(["--upgrade"] if upgrade else []),
               "-o", str(output)]
    result = subprocess.run(command, cwd=root, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"uv could not lock {lock.path}:\n{result.stderr.strip()}")


def recompile_problems(root: Path) -> list[str]:
    """Lock again from pyproject.toml, starting from the committed pins, and report any difference."""
    problems = []
    with tempfile.TemporaryDirectory() as scratch:
        for lock in LOCKS:
            committed = (root / lock.path).read_text(encoding="utf-8")
            fresh = Path(scratch) / Path(lock.path).name
            fresh.write_text(committed, encoding="utf-8")
            compile_lock(root, lock, fresh)
            diff = list(difflib.unified_diff(committed.splitlines(), fresh.read_text(encoding="utf-8").splitlines(),
                                             f"{lock.path} (committed)", f"{lock.path} (from pyproject.toml)",
                                             lineterm="", n=1))
            if diff:
                shown = "\n".join(diff[:60]) + ("\n..." if len(diff) > 60 else "")
                problems.append(f"{lock.path} is not what pyproject.toml locks to:\n{shown}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("compile", help="write the locks from pyproject.toml and extra.in")
    make.add_argument("--upgrade", action="store_true", help="move every pin to the newest release allowed")
    check = commands.add_parser("check", help="exit 1 when a lock and pyproject.toml disagree")
    check.add_argument("--offline", action="store_true", help="skip locking again against the package index")
    args = parser.parse_args(argv)
    root: Path = args.root
    if args.command == "compile":
        for lock in LOCKS:
            compile_lock(root, lock, root / lock.path, upgrade=args.upgrade)
            print(f"wrote {lock.path}")  # noqa: T201
        return 0
    problems = offline_problems(root)
    if not problems and not args.offline:
        problems = recompile_problems(root)
    for problem in problems:
        print(problem, file=sys.stderr)  # noqa: T201
    if problems:
        print("the locks and pyproject.toml disagree: run `make lock` and commit requirements/", file=sys.stderr)  # noqa: T201
        return 1
    print("the locks agree with pyproject.toml" + (" (offline checks only)" if args.offline else ""))  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
