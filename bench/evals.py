"""The evaluation runner's own cost per cell, against a bare loop of the same gateway calls and,
with ``--before REF``, against the runner of an earlier commit, in the same run.

    .venv/bin/python bench/evals.py [--delay-ms 0] [--before dd58f5e]

Runs the default grid (3 bare levels + 3 roles x 2 offline models x the shipped query set) on a
fresh SQLite file in a process of its own: with this checkout's runner (the cells as Inspect AI
tasks, ``evals/inspect_run.py``) and, with ``--before``, with the runner of commit REF (checked out
in a temporary git worktree with this checkout's encoder and heads, so that only the runner differs,
run on this checkout's virtual environment). Then it sends the very
same model calls (every message of every cell, with the conversation so far) through the gateway in
a plain loop at the same concurrency, with no monitors, policy, judge, database or Inspect.
Overhead per cell = (grid seconds - bare seconds) / cells.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chat.gateway import Gateway  # noqa: E402
from evals.grid import load_grid  # noqa: E402
from evals.runner import plan  # noqa: E402
from study.settings import get_settings  # noqa: E402

MODEL_FILES = ("encoder_tuned.safetensors", "head.npz", "reading.npz")

# Run in the checkout given as argv[1]: the default grid on a fresh SQLite file, timed.
_GRID = """
import json, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from evals.grid import load_grid
from evals.runner import create_run, execute_run, plan
from study.db import make_engine, migrate
path = Path(sys.argv[1]) / "evals" / "grids" / "default.yaml"
with tempfile.TemporaryDirectory() as folder:
    url = f"sqlite:///{folder}/bench.db"
    migrate(url)
    engine = make_engine(url)
    run_id = create_run(engine, plan(load_grid(path), path.parent))
    started = time.perf_counter()
    outcome = execute_run(engine, run_id, progress=False)
    seconds = time.perf_counter() - started
    print(json.dumps({"seconds": seconds, "cells": outcome.executed, "finished": outcome.finished}))
"""


def timed_grid(checkout: Path, logs: Path) -> dict[str, float]:
    env = {**os.environ, "AFTERWARD_EVAL_LOG_DIR": str(logs), "PYTHONPATH": str(checkout)}
    done = subprocess.run([sys.executable, "-c", _GRID, str(checkout)], cwd=checkout, env=env, capture_output=True,
                          text=True, timeout=3600, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the grid in {checkout} failed:\n{done.stderr[-3000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    if not result["finished"]:
        raise SystemExit(f"the grid in {checkout} left cells undone")
    return result


async def bare_loop(gateway: Gateway, calls: list[tuple[str, list[dict[str, str]]]], limit: int) -> None:
    gate = asyncio.Semaphore(limit)

    async def one(model: str, messages: list[dict[str, str]]) -> None:
        async with gate:
            await gateway.complete(messages, model)

    await asyncio.gather(*(one(model, messages) for model, messages in calls))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--delay-ms", type=float, default=0.0, help="simulated generation time per offline call")
    parser.add_argument("--before", metavar="REF", help="also time the runner of this git commit")
    args = parser.parse_args()
    os.environ["AFTERWARD_OFFLINE_LLM_DELAY_MS"] = str(args.delay_ms)
    print(f"load at start {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    grid_path = ROOT / "evals" / "grids" / "default.yaml"
    planned = plan(load_grid(grid_path), grid_path.parent)
    with tempfile.TemporaryDirectory() as folder:
        timings = {"this checkout (Inspect AI tasks)": timed_grid(ROOT, Path(folder) / "logs")}
        if args.before:
            tree = Path(folder) / "before"
            subprocess.run(["git", "worktree", "add", "--detach", str(tree), args.before], cwd=ROOT, check=True,
                           capture_output=True)
            for name in MODEL_FILES:  # the same reading of messages on both sides: only the runner differs
                shutil.copyfile(ROOT / "chat" / "crisis_data" / name, tree / "chat" / "crisis_data" / name)
            try:
                timings[f"{args.before} (its runner)"] = timed_grid(tree, Path(folder) / "logs-before")
            finally:
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)
    calls = []
    for condition in planned.conditions:
        for model in planned.grid.models:
            for query in planned.query_list:
                history: list[dict[str, str]] = [{"role": "system", "content": condition.system_text}]
                for message in query.turns:
                    history = [*history, {"role": "user", "content": message}]
                    calls.append((model, history))
                    history = [*history, {"role": "assistant", "content": "(a reply)"}]
    get_settings.cache_clear()
    gateway = Gateway(get_settings())
    started = time.perf_counter()
    asyncio.run(bare_loop(gateway, calls, planned.grid.limit("offline")))
    bare = time.perf_counter() - started
    cells = int(next(iter(timings.values()))["cells"])
    print(f"cells {cells}, model calls {len(calls)}, offline delay {args.delay_ms:g} ms")
    print(f"bare gateway loop, same calls: {bare:.1f} s, {1000 * bare / cells:.1f} ms/cell")
    for name, timing in timings.items():
        seconds = timing["seconds"]
        print(f"{name}: {seconds:.1f} s, {1000 * seconds / cells:.1f} ms/cell, "
              f"overhead {1000 * (seconds - bare) / cells:.1f} ms/cell over the bare loop")


if __name__ == "__main__":
    main()
