"""The evaluation harness's own overhead per cell, against a bare loop of the same gateway calls.

    .venv/bin/python bench/evals.py [--delay-ms 0]

Runs the default grid (3 bare levels + 3 roles x 2 offline models x the shipped query set) on a
fresh SQLite file, then sends the very same model calls (every message of every cell, with the
conversation so far) through the same gateway in a plain loop at the same concurrency, with no
monitors, policy, judge or database. Overhead per cell = (grid seconds - bare seconds) / cells.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chat.gateway import Gateway  # noqa: E402
from evals.grid import load_grid  # noqa: E402
from evals.runner import create_run, execute_run, gateway_for, plan  # noqa: E402
from study.db import make_engine, migrate  # noqa: E402


async def bare_loop(gateway: Gateway, calls: list[tuple[str, list[dict[str, str]]]], limit: int) -> None:
    gate = asyncio.Semaphore(limit)

    async def one(model: str, messages: list[dict[str, str]]) -> None:
        async with gate:
            await gateway.complete(messages, model)

    await asyncio.gather(*(one(model, messages) for model, messages in calls))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--delay-ms", type=float, default=0.0, help="simulated generation time per offline call")
    args = parser.parse_args()
    os.environ["AFTERWARD_OFFLINE_LLM_DELAY_MS"] = str(args.delay_ms)
    grid_path = ROOT / "evals" / "grids" / "default.yaml"
    planned = plan(load_grid(grid_path), grid_path.parent)
    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:///{folder}/bench.db"
        migrate(url)
        engine = make_engine(url)
        run_id = create_run(engine, planned)
        started = time.perf_counter()
        outcome = execute_run(engine, run_id, progress=False)
        grid_seconds = time.perf_counter() - started
        engine.dispose()
    calls = []
    for condition in planned.conditions:
        for model in planned.grid.models:
            for query in planned.query_list:
                history: list[dict[str, str]] = [{"role": "system", "content": condition.system_text}]
                for message in query.turns:
                    history = [*history, {"role": "user", "content": message}]
                    calls.append((model, history))
                    history = [*history, {"role": "assistant", "content": "(a reply)"}]
    gateway = gateway_for(planned.grid)
    started = time.perf_counter()
    asyncio.run(bare_loop(gateway, calls, planned.grid.limit("offline")))
    bare_seconds = time.perf_counter() - started
    cells = outcome.executed
    print(f"cells {cells}, model calls {len(calls)}, offline delay {args.delay_ms:g} ms")
    print(f"grid (pipeline + judge + database): {grid_seconds:.1f} s, {1000 * grid_seconds / cells:.1f} ms/cell")
    print(f"bare gateway loop, same calls:      {bare_seconds:.1f} s, {1000 * bare_seconds / cells:.1f} ms/cell")
    print(f"harness overhead per cell: {1000 * (grid_seconds - bare_seconds) / cells:.1f} ms")


if __name__ == "__main__":
    main()
