"""The first chat reply after start-up does no one-time work the later replies do not (issue 29):
the app's start-up (its lifespan: the encoder, the gateway, the routes and a rehearsed turn,
``api.app``) leaves nothing for the first participant's message to load, import or build.

Each check runs in a process of its own, since what a process loads once is what is measured (in
the test process another test has loaded it already). The child starts the app as uvicorn does,
then sends each participant's first message in a conversation of its own (the same path each
time) and reports, for each reply, the modules imported while it was answered and the process's
CPU time (every thread). Properties, not the machine's speed: the first reply imports nothing, and
its CPU time is within the later replies' spread, far below what loading the encoder alone costs.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from api.app import create_app
from tests.builders import enroll_fully, make_invites, put_in_arm, start_chat
from tests.conftest import POSTGRES_URL

ROOT = Path(__file__).resolve().parents[2]
REPLIES = 6
MESSAGES = ["Can you help me plan my week? I have three deadlines and a family visit.",
            "What is a good way to start a difficult conversation with my sister?",
            "I want to get back into running after a knee injury, where do I start?"]


def child(url: str, people: list[tuple[str, int]]) -> list[dict[str, object]]:
    from chat import semantic
    from chat.encoder import _load
    from study.db import make_engine

    out: list[dict[str, object]] = []
    with TestClient(create_app(make_engine(url))) as client:  # runs the lifespan, as uvicorn does before serving
        assert semantic.loaded(), "the encoder was not loaded at start-up"
        for i, (token, conversation) in enumerate(people):
            modules = set(sys.modules)
            cpu = time.process_time()
            response = client.post(f"/api/v1/me/conversations/{conversation}/messages",
                                   headers={"Authorization": f"Bearer {token}"},
                                   json={"content": f"{MESSAGES[i % len(MESSAGES)]} ({i})"})
            out.append({"status": response.status_code, "cpu_s": time.process_time() - cpu,
                        "imported": sorted(set(sys.modules) - modules)})
    cpu = time.process_time()
    _load.__wrapped__()  # what the first message would cost if start-up had not loaded the encoder
    return [*out, {"encoder_load_cpu_s": time.process_time() - cpu}]


@pytest.mark.skipif(bool(POSTGRES_URL), reason="what a process loads once does not depend on the database")
def test_the_first_reply_after_start_up_loads_nothing_the_later_ones_do_not(engine: Engine, slug: str) -> None:
    people: list[tuple[str, int]] = []
    client = TestClient(create_app(engine))  # no lifespan: this process only enrolls
    for invite in make_invites(engine, slug, count=REPLIES):
        who = enroll_fully(client, invite)
        put_in_arm(engine, who.code, "wellbeing")
        people.append((who.token, start_chat(client, who, "coach")))
    url = engine.url.render_as_string(hide_password=False)
    done = subprocess.run([sys.executable, "-m", "tests.api.test_first_reply", url, json.dumps(people)],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    *replies, loading = json.loads(done.stdout.strip().splitlines()[-1])
    assert [r["status"] for r in replies] == [200] * REPLIES
    first, later = replies[0], replies[1:]
    assert first["imported"] == [], f"the first reply imported modules start-up did not: {first['imported']}"
    # The bound is this machine's own: twice the slowest later reply, plus a quarter of what loading
    # the encoder costs in the same process (about a second of CPU against a turn's tens of
    # milliseconds). What the first reply still does more than the later ones is compile the
    # turn's SQL statements into the real engine's statement cache (the rehearsal's scratch
    # database has an engine of its own): about 0.05 s of CPU, within the bound.
    slowest = max(float(r["cpu_s"]) for r in later)
    bound = 2 * slowest + float(loading["encoder_load_cpu_s"]) / 4
    assert float(first["cpu_s"]) <= bound, (first["cpu_s"], statistics.median(
        float(r["cpu_s"]) for r in later), loading)


if __name__ == "__main__":
    sys.stdout.write(json.dumps(child(sys.argv[1], [(token, int(c)) for token, c in json.loads(sys.argv[2])])) + "\n")
