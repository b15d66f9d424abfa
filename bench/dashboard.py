"""The staff dashboard at scale: every page rendered under Streamlit's AppTest, signed in as an
admin (viewers' pages: the aggregate tables only), cold (cache cleared) and warm, on SQLite and
PostgreSQL, with the app's peak memory.

    .venv/bin/python bench/dashboard.py                              # 100,000 participants, both databases
    .venv/bin/python bench/dashboard.py --participants 10000 --database sqlite

The study is bulk-written by ``bench/analysis_data.generate`` (2 conversations of 10 turns per
participant, the protocol's baseline and follow-ups as the services leave them), in a child
process, so the parent's peak RSS (``ru_maxrss``) is the dashboard's. Baseline in the same run:
the ``analysis`` calls the pages make, timed alone, cold: what the dashboard adds is the page.
"""

from __future__ import annotations

import argparse
import datetime as dt
import multiprocessing
import os
import resource
import time
from collections.abc import Callable
from typing import Any

from common import ROOT, postgres_schema

os.environ.setdefault("AFTERWARD_AUDIT_ANCHOR_PATH", f"/tmp/afterward-bench-dashboard-{os.getpid()}.jsonl")

import streamlit as st  # noqa: E402
from analysis_data import SMALL, generate  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

from analysis.aggregates import aggregate_tables  # noqa: E402
from analysis.models import StudyData  # noqa: E402
from analysis.reading import connect, resolve_study_id  # noqa: E402
from analysis.report import fit_models  # noqa: E402
from dashboard import data  # noqa: E402
from study import audit, staff, studies  # noqa: E402
from study.db import make_engine, migrate, session_scope  # noqa: E402
from study.models import StaffRole  # noqa: E402
from study.settings import get_settings  # noqa: E402

PAGES = ["overview", "enrollment", "followups", "outcomes", "conversation_outcomes", "safety", "conversations",
         "data_quality", "exports"]
VIEWER_PAGES = ["overview", "enrollment", "followups", "outcomes", "exports"]
PASSWORD = "bench password 123"


def _generate(url: str, participants: int, queue: Any) -> None:
    engine = make_engine(url, timeouts=False)
    started = time.perf_counter()
    slug, codes = generate(engine, participants * 20, **SMALL)  # type: ignore[arg-type]
    with session_scope(engine) as session:
        study = studies.get_study(session, slug)
        for role in (StaffRole.ADMIN, StaffRole.VIEWER):
            account = staff.create_staff(session, email=f"{role}@bench.example", name=str(role), password=PASSWORD,
                                         actor=audit.Actor.system("bench"))
            staff.grant(session, account, study, role, audit.Actor.system("bench"))
    engine.dispose()
    queue.put((slug, len(codes), time.perf_counter() - started))


def timed(work: Callable[[], Any]) -> float:
    began = time.perf_counter()
    work()
    return time.perf_counter() - began


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def baseline(url: str, slug: str, models: bool) -> None:
    """The analysis calls alone, cold (no Streamlit)."""
    engine = make_engine(url)
    with connect(engine) as connection:
        study_id = resolve_study_id(connection, slug)
    loaded: dict[str, StudyData] = {}
    steps: list[tuple[str, Callable[[], Any]]] = [
        ("StudyData.load (panel, features, survival)", lambda: loaded.setdefault("d", StudyData.load(engine, slug))),
        ("fit_models (the report's models)", lambda: fit_models(loaded["d"], n_boot=data.BOOTSTRAP)),
        ("aggregate_tables, threshold 5 (viewers)", lambda: aggregate_tables(engine, slug)),
        ("aggregate_tables, threshold 0", lambda: aggregate_tables(engine, slug, threshold=0)),
        ("dashboard SQL aggregates (queries.py)", lambda: data.counts.__wrapped__(url, study_id)),  # type: ignore[attr-defined]
    ]
    for name, work in steps if models else [step for step in steps if not step[0].startswith("fit_models")]:
        print(f"  baseline {name}: {timed(work):.2f} s", flush=True)
    engine.dispose()


def render(app: AppTest, page: str) -> float:
    app.switch_page(f"views/{page}.py")
    began = time.perf_counter()
    app.run()
    seconds = time.perf_counter() - began
    if app.exception:
        raise RuntimeError(f"{page}: {app.exception[0].value}")
    return seconds


def bench_pages(url: str, role: StaffRole, pages: list[str]) -> None:
    if not pages:
        return
    app = AppTest.from_file(str(ROOT / "dashboard" / "app.py"), default_timeout=3600)
    app.run()
    app.text_input[0].input(f"{role}@bench.example")
    app.text_input[1].input(PASSWORD)
    app.button[0].click()
    app.run()
    assert not app.error, [e.value for e in app.error]
    for page in pages:
        st.cache_data.clear()  # cold: every read of the page from the database
        cold = render(app, page)
        warm = render(app, page)
        print(f"  {role:<10} {page:<22} cold {cold:7.2f} s   warm {warm:6.2f} s   peak RSS so far {peak_mb():,.0f} MB",
              flush=True)


def run(url: str, participants: int, pages: list[str], models: bool) -> None:
    queue: Any = multiprocessing.get_context("fork").Queue()
    child = multiprocessing.get_context("fork").Process(target=_generate, args=(url, participants, queue))
    child.start()
    slug, n, seconds = queue.get()
    child.join()
    print(f"  generated {n:,} participants in {seconds:.0f} s (in a child process)", flush=True)
    os.environ["AFTERWARD_DATABASE_URL"] = url
    get_settings.cache_clear()
    print(f"  peak RSS after imports: {peak_mb():,.0f} MB")
    baseline(url, slug, models)
    print(f"  peak RSS after the baseline: {peak_mb():,.0f} MB", flush=True)
    bench_pages(url, StaffRole.ADMIN, [p for p in PAGES if p in pages])
    bench_pages(url, StaffRole.VIEWER, [p for p in VIEWER_PAGES if p in pages])
    print(f"  peak RSS of the whole run: {peak_mb():,.0f} MB at {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--participants", type=int, default=100_000)
    parser.add_argument("--postgres-url", default=os.environ.get(
        "AFTERWARD_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--pages", default=",".join(PAGES), help="comma-separated, of: " + ", ".join(PAGES))
    parser.add_argument("--no-models", action="store_true", help="leave fit_models out of the baseline")
    args = parser.parse_args()
    pages = args.pages.split(",")
    if args.database in ("sqlite", "both"):
        path = f"/tmp/afterward-bench-dashboard-{os.getpid()}.db"
        try:
            migrate(f"sqlite:///{path}")
            print(f"== SQLite, {args.participants:,} participants")
            run(f"sqlite:///{path}", args.participants, pages, not args.no_models)
        finally:
            if os.path.exists(path):
                os.remove(path)
    if args.database in ("postgres", "both"):
        with postgres_schema(args.postgres_url) as url:
            migrate(url)
            print(f"== PostgreSQL, {args.participants:,} participants")
            run(url, args.participants, pages, not args.no_models)


if __name__ == "__main__":
    main()
