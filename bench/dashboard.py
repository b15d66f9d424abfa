"""The staff dashboard at scale: every page rendered under Streamlit's AppTest, signed in as an
admin (viewers' pages: the aggregate tables only), cold (cache cleared) and warm, on SQLite and
PostgreSQL, with the app's peak memory.

    .venv/bin/python bench/dashboard.py                              # 100,000 participants, both databases
    .venv/bin/python bench/dashboard.py --participants 10000 --database sqlite
    .venv/bin/python bench/dashboard.py --sqlite-path /tmp/d100k.db --postgres-schema dash100k   # keep, reuse

The study is bulk-written by ``bench/analysis_data.generate`` (2 conversations of 10 turns per
participant, the protocol's baseline and follow-ups as the services leave them), in a child
process, so the parent's peak RSS (``ru_maxrss``) is the dashboard's. The report's models are
fitted once the way the dashboard has them fitted, by ``afterward models fit`` in a process of
its own (timed, with its peak RSS), unless a stored fit exists; the model pages then read it.
Baseline in the same run: the ``analysis`` reads the pages make, timed alone, cold.
"""

from __future__ import annotations

import argparse
import datetime as dt
import multiprocessing
import os
import re
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from common import ROOT, postgres_schema

os.environ.setdefault("AFTERWARD_AUDIT_ANCHOR_PATH", f"/tmp/afterward-bench-dashboard-{os.getpid()}.jsonl")
os.environ["AFTERWARD_MODEL_FIT_MAX_AGE_MINUTES"] = "0"  # the pages read the stored fit; no refit mid-run

import sqlalchemy as sa  # noqa: E402
import streamlit as st  # noqa: E402
from analysis_data import SMALL, generate  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

from analysis import fits  # noqa: E402
from analysis import operations as queries  # noqa: E402
from analysis.aggregates import aggregate_tables  # noqa: E402
from analysis.reading import connect, resolve_study_id  # noqa: E402
from dashboard import data  # noqa: E402
from study import audit, staff, studies  # noqa: E402
from study.db import make_engine, migrate, session_scope  # noqa: E402
from study.models import StaffRole, Study  # noqa: E402
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


def _existing(url: str) -> str | None:
    """The slug of the study a kept database already holds (a previous run's), or None."""
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            return connection.scalar(sa.select(Study.slug).limit(1))
    except sa.exc.DBAPIError:
        return None
    finally:
        engine.dispose()


def ensure_fit(url: str, slug: str) -> None:
    """A stored fit of the models: the newest one, or one made now by ``afterward models fit`` in
    its own process, timed with its peak RSS (what the dashboard starts in the background)."""
    engine = make_engine(url)
    found = fits.latest_fit(engine, slug)
    engine.dispose()
    if found is not None:
        print(f"  stored fit {found.id} reused: fitted in {found.seconds:.0f} s, {found.participants:,} participants",
              flush=True)
        return
    began = time.perf_counter()
    done = subprocess.run(["/usr/bin/time", "-v", sys.executable, "-m", "api", "models", "fit", slug, "--as",
                           f"{StaffRole.ADMIN}@bench.example"], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "AFTERWARD_DATABASE_URL": url}, check=False)
    seconds = time.perf_counter() - began
    peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    if done.returncode:
        raise RuntimeError(f"afterward models fit failed: {done.stdout}{done.stderr[-2000:]}")
    print(f"  afterward models fit: {seconds:.0f} s, peak RSS {int(peak.group(1)) / 1024 if peak else 0:,.0f} MB "
          f"(its own process)", flush=True)


def timed(work: Callable[[], Any]) -> float:
    began = time.perf_counter()
    work()
    return time.perf_counter() - began


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def baseline(url: str, slug: str) -> None:
    """The analysis reads the pages make, alone, cold (no Streamlit)."""
    engine = make_engine(url)
    with connect(engine) as connection:
        study_id = resolve_study_id(connection, slug)
    steps: list[tuple[str, Callable[[], Any]]] = [
        ("aggregate_tables, threshold 5 (viewers)", lambda: aggregate_tables(engine, slug)),
        ("aggregate_tables, threshold 0", lambda: aggregate_tables(engine, slug, threshold=0)),
        *((f"summary {name}", lambda read=read: read(engine, slug)) for name, read in data.SUMMARIES.items()),
        ("the stored fit (analysis.fits.latest_fit)", lambda: fits.latest_fit(engine, slug)),
    ]
    for name, work in steps:
        print(f"  baseline {name}: {timed(work):.2f} s", flush=True)
    with connect(engine) as connection:
        each = {name: timed(lambda query=query: query(connection, study_id)) for name, query in queries.QUERIES.items()}
    print("  baseline dashboard SQL aggregates: " + ", ".join(f"{n} {t:.2f}" for n, t in each.items())
          + f" (all {sum(each.values()):.2f} s)", flush=True)
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


def run(url: str, participants: int, pages: list[str]) -> None:
    slug = _existing(url)
    if slug is None:
        migrate(url)
        queue: Any = multiprocessing.get_context("fork").Queue()
        child = multiprocessing.get_context("fork").Process(target=_generate, args=(url, participants, queue))
        child.start()
        slug, n, seconds = queue.get()
        child.join()
        print(f"  generated {n:,} participants in {seconds:.0f} s (in a child process)", flush=True)
    else:
        migrate(url)
        print(f"  reusing the kept study {slug!r}", flush=True)
    ensure_fit(url, slug)
    os.environ["AFTERWARD_DATABASE_URL"] = url
    get_settings.cache_clear()
    print(f"  peak RSS after imports: {peak_mb():,.0f} MB")
    baseline(url, slug)
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
    parser.add_argument("--sqlite-path", help="keep the SQLite study here (reused when it exists)")
    parser.add_argument("--postgres-schema", help="keep the PostgreSQL study in this schema (reused when it exists)")
    parser.add_argument("--pages", default=",".join(PAGES), help="comma-separated, of: " + ", ".join(PAGES))
    args = parser.parse_args()
    pages = args.pages.split(",")
    if args.database in ("sqlite", "both"):
        path = args.sqlite_path or f"/tmp/afterward-bench-dashboard-{os.getpid()}.db"
        print(f"== SQLite, {args.participants:,} participants")
        try:
            run(f"sqlite:///{path}", args.participants, pages)
        finally:
            if not args.sqlite_path and os.path.exists(path):
                os.remove(path)
    if args.database in ("postgres", "both"):
        print(f"== PostgreSQL, {args.participants:,} participants")
        if args.postgres_schema:
            admin = sa.create_engine(args.postgres_url)
            with admin.begin() as connection:
                connection.execute(sa.text(f'CREATE SCHEMA IF NOT EXISTS "{args.postgres_schema}"'))
            admin.dispose()
            scoped = sa.engine.make_url(args.postgres_url).update_query_dict(
                {"options": f"-csearch_path={args.postgres_schema}"})
            run(scoped.render_as_string(hide_password=False), args.participants, pages)
        else:
            with postgres_schema(args.postgres_url) as url:
                run(url, args.participants, pages)


if __name__ == "__main__":
    main()
