"""What software an export or a report was made with: Afterward's version and the releases of the packages
its numbers come from, checked against the lock they were installed from (requirements/runtime.txt), so a
rerun a year later can install the same ones.

    >>> from analysis.software import packages_line
    >>> packages_line()  # doctest: +SKIP
    'numpy 2.4.6, pandas 2.3.3, ... (as locked in requirements/runtime.txt)'
"""

from __future__ import annotations

import re
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from study.settings import PROJECT_ROOT

LOCK = PROJECT_ROOT / "requirements" / "runtime.txt"
# The packages that compute what exports and reports contain (features, models, file formats, codebooks).
ANALYSIS_PACKAGES = ("numpy", "pandas", "scipy", "statsmodels", "lifelines", "pyarrow", "pyreadstat",
                     "vaderSentiment", "frictionless")
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", re.MULTILINE)


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def afterward_version() -> str:
    try:
        return metadata.version("afterward")
    except metadata.PackageNotFoundError:
        return "unknown"


def installed_versions(names: tuple[str, ...] = ANALYSIS_PACKAGES) -> dict[str, str]:
    """The release of each package in this environment ("not installed" where missing)."""
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


@lru_cache(maxsize=4)
def locked_versions(lock: Path = LOCK) -> dict[str, frozenset[str]]:
    """The pinned releases of a lock file by canonical name (empty when there is no lock beside the code)."""
    if not lock.is_file():
        return {}
    pins: dict[str, set[str]] = {}
    for name, version in _PIN.findall(lock.read_text(encoding="utf-8")):
        pins.setdefault(_canonical(name), set()).add(version)
    return {name: frozenset(versions) for name, versions in pins.items()}


def packages_line(lock: Path = LOCK) -> str:
    """The analysis packages' releases and whether they are the locked ones, for a README or a report."""
    installed = installed_versions()
    listed = ", ".join(f"{name} {version}" for name, version in installed.items())
    locked = locked_versions(lock)
    if not locked:
        return f"{listed} (no lock file found at {lock.name}: these may not be the locked releases)"
    differing = [f"{name} {version} installed, {' or '.join(sorted(locked.get(_canonical(name), {'none'})))} locked"
                 for name, version in installed.items() if version not in locked.get(_canonical(name), ())]
    where = f"{lock.parent.name}/{lock.name}"
    if differing:
        return f"{listed} (not as locked in {where}: {'; '.join(differing)})"
    return f"{listed} (as locked in {where})"
