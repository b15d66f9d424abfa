"""Where a run's numbers came from: the code it was made with, recorded with the run
(``EvalRun.provenance``) and shown in its report and model cards.

``collect`` reads, when the run is created:

- ``commit``: the project's git commit (``git rev-parse HEAD`` in the source tree), and ``dirty``:
  whether the working tree differed from it (tracked changes or untracked files, as ``git status``
  lists them); both ``None`` where there is no git or no repository (an installed package);
- ``version``: the installed ``afterward`` version, which is all there is without git;
- ``packages``: the installed versions of the packages the harness's numbers depend on
  (``PACKAGES``; ``None`` for one not installed) and ``locked``: their versions in
  ``requirements/runtime.txt``, whose SHA-256 is ``requirements_sha256`` (``None`` without the file).

A resume or a re-scoring under other code is noted too (``note_code``), under ``later``, so a run
finished by two commits says so. Nothing here writes to git: ``git status`` runs with
``--no-optional-locks``, so it does not even refresh the index.

    >>> found = collect()
    >>> describe(found)   # "commit 1a2b3c4d5e6f (uncommitted changes), afterward 0.1.0"
"""

from __future__ import annotations

import hashlib
import re
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from sqlalchemy import update
from sqlalchemy.engine import Engine

from evals.models import EvalRun
from study.clock import now
from study.db import session_scope

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements" / "runtime.txt"
# The distributions whose versions can move the harness's numbers: the project itself, the model
# gateway, the statistics, the frames, the encoders of the monitors the roles run through.
PACKAGES = ("afterward", "litellm", "numpy", "scipy", "pandas", "statsmodels", "scikit-learn", "onnxruntime",
            "tokenizers", "pydantic", "sqlalchemy")
GIT_SECONDS = 10.0
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "--no-optional-locks", "-C", str(root), *args], capture_output=True,
                              text=True, timeout=GIT_SECONDS, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def git_state(root: Path = ROOT) -> tuple[str | None, bool | None]:
    """The commit checked out in ``root`` and whether the tree differs from it (None, None: no git
    or not a repository)."""
    head = _git(root, "rev-parse", "--verify", "HEAD")
    if head is None or not re.fullmatch(r"[0-9a-f]{40,64}", head.strip()):
        return None, None
    status = _git(root, "status", "--porcelain")
    return head.strip(), None if status is None else bool(status.strip())


def installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def locked_versions(text: str) -> dict[str, str]:
    """``name==version`` pins of a lock file (pip-compile or ``uv pip compile`` output), by normalized name."""
    found = {}
    for line in text.splitlines():
        pin = _PIN.match(line.strip())
        if pin:
            found[_normal(pin.group(1))] = pin.group(2)
    return found


def collect(root: Path = ROOT, lock: Path = LOCK) -> dict[str, Any]:
    """The code as it is now (see the module's docstring for each key)."""
    commit, dirty = git_state(root)
    try:
        lock_bytes: bytes | None = lock.read_bytes()
    except OSError:
        lock_bytes = None
    pins = locked_versions(lock_bytes.decode("utf-8", "replace")) if lock_bytes is not None else {}
    return {"commit": commit, "dirty": dirty, "version": installed("afterward"),
            "packages": {name: installed(name) for name in PACKAGES},
            "locked": {name: pins.get(_normal(name)) for name in PACKAGES},
            "requirements_sha256": None if lock_bytes is None else hashlib.sha256(lock_bytes).hexdigest()}


def same_code(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two records describe the same code (commit, tree state, versions, lock)."""
    keys = ("commit", "dirty", "version", "packages", "requirements_sha256")
    return all(a.get(key) == b.get(key) for key in keys)


def note_code(engine: Engine, run_id: int, step: str, current: dict[str, Any] | None = None) -> bool:
    """Record, under the run's ``provenance["later"]``, that ``step`` (a resume, a re-scoring) ran
    under other code than the run was created with (and than any step noted before); True when it
    was noted. A run from before provenance was recorded gets nothing: what it began with is unknown."""
    current = collect() if current is None else current
    with session_scope(engine) as session:
        run = session.get(EvalRun, run_id)
        if run is None or run.provenance is None:
            return False
        recorded = dict(run.provenance)
        later = list(recorded.get("later", []))
        if same_code(recorded, current) or any(same_code(entry, current) for entry in later):
            return False
        later.append({"step": step, "at": now().isoformat(timespec="seconds"), **current})
        session.execute(update(EvalRun).where(EvalRun.id == run_id).values(provenance={**recorded, "later": later})
                        .execution_options(synchronize_session=False))
    return True


def describe(found: dict[str, Any] | None) -> str:
    """The code in one line: the commit (and whether the tree was dirty) or, without git, the version."""
    if not found:
        return "not recorded (a run from before the code was recorded)"
    version = f"afterward {found.get('version') or 'not installed'}"
    commit = found.get("commit")
    if not commit:
        return f"{version} (no git commit found)"
    state = {True: "uncommitted changes", False: "clean", None: "tree state unknown"}[found.get("dirty")]
    return f"commit {commit[:12]} ({state}), {version}"


def describe_packages(found: dict[str, Any] | None) -> str:
    """``name version`` of each package, with its locked version where it differs."""
    if not found:
        return "not recorded"
    parts = []
    locked = found.get("locked") or {}
    for name, version in (found.get("packages") or {}).items():
        if name == "afterward":
            continue
        pin = locked.get(name)
        parts.append(f"{name} {version or 'not installed'}" + (f" (locked {pin})" if pin and pin != version else ""))
    digest = found.get("requirements_sha256")
    lock = f"requirements/runtime.txt SHA-256 {digest[:12]}" if digest else "requirements/runtime.txt not found"
    return "; ".join(parts) + f"; {lock}"


def describe_later(found: dict[str, Any] | None) -> list[str]:
    """One line per step that ran under other code (``note_code``)."""
    return [f"{entry['step']} at {entry['at']} under {describe(entry)}" for entry in (found or {}).get("later", [])]
