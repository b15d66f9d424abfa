"""The API's first chat reply after start-up against its later replies (offline model, SQLite).

    .venv/bin/python bench/first_reply.py [--processes 5] [--later 20]

Each measurement is a process of its own, since the crisis encoder (``chat.encoder``, ~1 s to
load) is loaded once per process: the app is started (its lifespan loads the encoder before it
serves, ``chat.semantic.load``), then one participant sends a message and waits for the reply, then
``--later`` more. ``lazy`` starts the same app without running its lifespan, as before the encoder
was loaded at start-up, so the first message loads it. Printed: the start-up time and the first
and later replies' latency (median over processes; later: the median of each process's medians),
each split into the model's own time (``turns.latency_ms``, as the gateway measured the call) and
the platform's (the rest).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, enrolled  # first: sets the environment and sys.path
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.orm import Session

from api.app import create_app
from chat import service as chat_service
from study.db import make_engine, migrate
from study.models import Participant

MESSAGES = ["Can you help me plan my week? I have three deadlines and a family visit.",
            "Nobody at work ever listens to me, so I'm thinking of quitting.",
            "What is a good way to start a difficult conversation with my sister?"]


def child(mode: str, url: str, token: str, conversation: int, later: int) -> dict[str, object]:
    engine = make_engine(url)
    started = time.perf_counter()
    client = TestClient(create_app(engine))
    if mode == "startup":
        client.__enter__()  # runs the lifespan, as uvicorn does before it serves
    ready = time.perf_counter() - started
    latencies = []
    try:
        for i in range(later + 1):
            sent = time.perf_counter()
            response = client.post(f"/api/v1/me/conversations/{conversation}/messages",
                                   headers={"Authorization": f"Bearer {token}"},
                                   json={"content": f"{MESSAGES[i % len(MESSAGES)]} ({i})"})
            latencies.append(time.perf_counter() - sent)
            assert response.status_code == 200, response.text
    finally:
        if mode == "startup":
            client.__exit__(None, None, None)
    with engine.connect() as connection:  # the model's own time for each reply, as the gateway measured it
        model_ms = list(connection.execute(text(
            "SELECT latency_ms FROM turns WHERE conversation_id = :c AND speaker = 'assistant' ORDER BY id"),
            {"c": conversation}).scalars())
    own = [latency * 1000 - model for latency, model in zip(latencies, model_ms, strict=True)]
    return {"ready_s": ready, "first_ms": latencies[0] * 1000, "first_model_ms": model_ms[0], "first_own_ms": own[0],
            "later_ms": statistics.median(latencies[1:]) * 1000 if later else None,
            "later_model_ms": statistics.median(model_ms[1:]) if later else None,
            "later_own_ms": statistics.median(own[1:]) if later else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, default=5)
    parser.add_argument("--later", type=int, default=20)
    parser.add_argument("--child", nargs=4, metavar=("MODE", "URL", "TOKEN", "CONVERSATION"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        mode, url, token, conversation = args.child
        print(json.dumps(child(mode, url, token, int(conversation), args.later)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        migrate(url)

        def conversation(session: Session, who: Participant) -> int:
            return chat_service.start_conversation(session, who, "coach").id
        people = iter(enrolled(make_engine(url), 2 * args.processes, arm="wellbeing", then=conversation))
        results: dict[str, list[dict[str, float]]] = {"startup": [], "lazy": []}
        for _ in range(args.processes):
            for mode in results:
                token, conversation_id = next(people)
                out = subprocess.run([sys.executable, __file__, "--later", str(args.later), "--child", mode, url,
                                      token, str(conversation_id)], capture_output=True, text=True, check=True,
                                     cwd=ROOT)
                results[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{args.processes} processes per mode, {args.later} later replies each (SQLite, offline model)")
    print("each reply: its latency, the model's own part (the gateway's measure) and the platform's (the rest)")
    print(f"{'mode':<10}{'start-up s':>12}{'first reply ms':>16}{'model':>8}{'platform':>10}"
          f"{'later replies ms':>18}{'model':>8}{'platform':>10}")
    for mode, runs in results.items():
        def median(key: str, runs: list[dict[str, float]] = runs) -> float:
            return statistics.median(r[key] for r in runs)
        print(f"{mode:<10}{median('ready_s'):>12.2f}{median('first_ms'):>16.1f}{median('first_model_ms'):>8.1f}"
              f"{median('first_own_ms'):>10.1f}{median('later_ms'):>18.1f}{median('later_model_ms'):>8.1f}"
              f"{median('later_own_ms'):>10.1f}")


if __name__ == "__main__":
    main()
