"""Chat turns per second through the API with 50 concurrent participants, on SQLite and
PostgreSQL, next to a bare loop of the same LiteLLM calls in the same run.

    .venv/bin/python bench/chat_turns.py [--participants 50] [--turns 20] [--postgres URL]

The offline provider answers at zero latency, so what is measured is the platform: auth and
consent check, storing the message (committed before the model is asked), the monitors, history
and policy, the gateway call through the LiteLLM Router, storing the reply. The baseline sends the
same prompts through the same Router with no platform around it, at the same concurrency.
Three runs per database:

- sequential: one participant, so latency is service time; overhead = platform p50 - bare p50;
- concurrent, in process: 50 participants through the ASGI app in this process (one core);
- concurrent, served: 50 participants over HTTP to ``afterward api --workers 2`` (both cores),
  against the bare loop in two processes. The load generator shares the two cores.

Under concurrency latency is mostly queueing (50 / rate), so the per-turn cost of the platform is
reported as 1/rate(platform) - 1/rate(bare).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import httpx
import sqlalchemy as sa
from common import ROOT, enrolled, postgres_schema  # first: sets the environment and sys.path
from sqlalchemy.orm import Session

from api.app import create_app
from chat import service as chat_service
from chat.gateway import Gateway
from chat.roles import system_prompt
from study.db import make_engine, migrate
from study.models import Participant
from study.settings import Settings

MESSAGES = [
    "Can you help me plan my week? I have three deadlines and a family visit.",
    "Nobody at work ever listens to me, so I'm thinking of quitting.",
    "What is a good way to start a difficult conversation with my sister?",
    "Just tell me what to do about the flat.",
    "Do you think she still likes me after the argument?",
]


def prepare(engine: sa.Engine, n: int) -> list[tuple[str, int]]:
    def conversation(session: Session, who: Participant) -> int:
        return chat_service.start_conversation(session, who, "coach").id
    return enrolled(engine, n, arm="wellbeing", then=conversation)


def quantiles(values: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(values, n=100)
    return q[49] * 1000, q[98] * 1000


async def run_served(port: int, work: list[tuple[str, int]], turns: int) -> tuple[list[float], float]:
    """The same requests over HTTP/1.1 keep-alive connections, one per participant. A minimal
    client written on asyncio streams, so the load generator takes little of the two cores."""
    latencies: list[float] = []

    async def participant(token: str, conversation: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for i in range(turns):
            body = json.dumps({"content": MESSAGES[i % len(MESSAGES)]}).encode()
            started = time.perf_counter()
            writer.write(f"POST /api/v1/me/conversations/{conversation}/messages HTTP/1.1\r\nHost: bench\r\n"
                         f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
                         f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            status = await reader.readline()
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode().partition(":")
                if name.lower() == "content-length":
                    length = int(value)
            await reader.readexactly(length)
            latencies.append(time.perf_counter() - started)
            assert b" 200 " in status, status
        writer.close()
    started = time.perf_counter()
    await asyncio.gather(*(participant(token, conversation) for token, conversation in work))
    return latencies, time.perf_counter() - started


async def run_platform(engine: sa.Engine, gateway: Gateway, work: list[tuple[str, int]],
                       turns: int) -> tuple[list[float], float]:
    latencies: list[float] = []
    transport = httpx.ASGITransport(app=create_app(engine, gateway))
    async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
        async def participant(token: str, conversation: int) -> None:
            for i in range(turns):
                started = time.perf_counter()
                response = await client.post(f"/api/v1/me/conversations/{conversation}/messages",
                                             headers={"Authorization": f"Bearer {token}"},
                                             json={"content": MESSAGES[i % len(MESSAGES)]})
                latencies.append(time.perf_counter() - started)
                assert response.status_code == 200, response.text
        started = time.perf_counter()
        await asyncio.gather(*(participant(token, conversation) for token, conversation in work))
        return latencies, time.perf_counter() - started


async def run_bare(gateway: Gateway, participants: int, turns: int) -> tuple[list[float], float]:
    latencies: list[float] = []
    system = system_prompt("coach").text

    async def participant() -> None:
        history: list[dict[str, str]] = [{"role": "system", "content": system}]
        for i in range(turns):
            history.append({"role": "user", "content": MESSAGES[i % len(MESSAGES)]})
            started = time.perf_counter()
            completion = await gateway.complete(history[-20:] if len(history) > 20 else history)
            latencies.append(time.perf_counter() - started)
            history.append({"role": "assistant", "content": completion.text})
    started = time.perf_counter()
    await asyncio.gather(*(participant() for _ in range(participants)))
    return latencies, time.perf_counter() - started


def _bare_process(participants: int, turns: int) -> tuple[list[float], float]:
    return asyncio.run(run_bare(Gateway(Settings(llm_retries=0)), participants, turns))


def run_bare_processes(processes: int, participants: int, turns: int) -> tuple[list[float], float]:
    """The bare loop split over ``processes`` processes started together; elapsed = the slowest."""
    with ProcessPoolExecutor(processes, mp_context=get_context("spawn")) as pool:
        list(pool.map(_bare_process, [1] * processes, [2] * processes))  # warm-up: imports
        started = time.perf_counter()
        results = list(pool.map(_bare_process, [participants // processes] * processes, [turns] * processes))
        elapsed = time.perf_counter() - started
    return [lat for latencies, _ in results for lat in latencies], elapsed


def serve(url: str, workers: int, wait_seconds: float = 30) -> tuple[subprocess.Popen[bytes], int]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "AFTERWARD_DATABASE_URL": url}
    process = subprocess.Popen([sys.executable, "-c", "from api.cli import main; main()", "api", "--port", str(port),
                                "--workers", str(workers), "--no-access-log"], env=env, cwd=ROOT,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + wait_seconds
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/healthz").status_code == 200:
                return process, port
        except httpx.HTTPError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError("the API did not start")


def report(label: str, latencies: list[float], elapsed: float) -> tuple[float, float, float]:
    rate = len(latencies) / elapsed
    p50, p99 = quantiles(latencies)
    print(f"  {label:<9} {rate:8.1f} turns/s   p50 {p50:7.2f} ms   p99 {p99:7.2f} ms")
    return rate, p50, p99


def stored_turns(engine: sa.Engine) -> int:
    with engine.connect() as connection:
        return int(connection.execute(sa.text("SELECT count(*) FROM turns WHERE speaker = 'assistant'")).scalar_one())


def compare(name: str, platform: tuple[list[float], float], bare: tuple[list[float], float]) -> None:
    rate, p50, p99 = report("platform", *platform)
    bare_rate, bare_p50, bare_p99 = report("bare", *bare)
    print(f"  {name}: platform at {rate / bare_rate:.0%} of the bare rate; platform cost per turn "
          f"{1000 / rate - 1000 / bare_rate:.2f} ms; latency difference p50 {p50 - bare_p50:+.2f} ms, "
          f"p99 {p99 - bare_p99:+.2f} ms")


async def bench(name: str, url: str, participants: int, turns: int, workers: int) -> None:
    # Set-up and checks touch the database: off the event loop, as the engine insists.
    await asyncio.to_thread(migrate, url)
    engine = make_engine(url)
    gateway = Gateway(Settings(llm_retries=0))
    work = await asyncio.to_thread(prepare, engine, participants + 1)
    solo, work = work[:1], work[1:]
    await run_platform(engine, gateway, solo, 5)  # warm-up: imports, pools, caches
    await run_bare(gateway, 1, 5)
    expected = await asyncio.to_thread(stored_turns, engine)

    print(f" sequential (1 participant, {turns * 5} turns)")
    compare(name, await run_platform(engine, gateway, solo, turns * 5), await run_bare(gateway, 1, turns * 5))
    print(f" concurrent in process ({participants} participants, {participants * turns} turns, one core)")
    compare(name, await run_platform(engine, gateway, work, turns), await run_bare(gateway, participants, turns))
    expected += turns * 5 + participants * turns
    if workers:
        process, port = serve(url, workers)
        try:
            print(f" concurrent served ({participants} participants, {participants * turns} turns, "
                  f"{workers} API workers vs {workers} bare processes)")
            await run_served(port, work[:4], 2)  # warm-up: each worker's imports and pools
            expected += 8
            served = await run_served(port, work, turns)
            compare(name, served, run_bare_processes(workers, participants, turns))
        finally:
            process.terminate()
            process.wait(30)
        expected += participants * turns
    stored = await asyncio.to_thread(stored_turns, engine)
    assert stored == expected, (stored, expected)  # every turn stored
    engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--participants", type=int, default=50)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--workers", type=int, default=2, help="API workers for the served run (0: skip it)")
    parser.add_argument("--postgres", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print("SQLite")
        asyncio.run(bench("SQLite", f"sqlite:///{tmp}/bench.db", args.participants, args.turns, args.workers))
    with postgres_schema(args.postgres) as url:
        print("PostgreSQL")
        asyncio.run(bench("PostgreSQL", url, args.participants, args.turns, args.workers))


if __name__ == "__main__":
    main()
