"""SIGTERM stops the API within seconds while it is busy: slow chat replies, streams and autosaves
in flight, on the same database the tests use (SQLite or PostgreSQL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
from sqlalchemy.engine import Engine

from tests.builders import CONFIRMATIONS, load_study, make_invites, put_in_arm
from tests.mail import free_port

AFTERWARD = Path(sys.executable).parent / "afterward"


def test_sigterm_under_load_exits_within_five_seconds(engine: Engine, example_protocol: str,
                                                      tmp_path: Path) -> None:
    slug = load_study(engine, example_protocol)
    port = free_port()
    env = {**os.environ, "AFTERWARD_DATABASE_URL": engine.url.render_as_string(hide_password=False),
           "AFTERWARD_OFFLINE_LLM_DELAY_MS": "20000", "AFTERWARD_ENVIRONMENT": "test",
           "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    log = (tmp_path / "api.log").open("w")
    server = subprocess.Popen([str(AFTERWARD), "api", "--port", str(port), "--no-access-log"], env=env,
                              stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert server.poll() is None, "the API exited at start-up"
            assert time.monotonic() < deadline, "the API did not start"
            time.sleep(0.2)

        participants = []
        for invite in make_invites(engine, slug, count=4):
            client = httpx.Client(base_url=url, timeout=30)
            body = client.post("/api/v1/enrollment", json={"invite_code": invite}).json()
            client.cookies.clear()
            client.headers["Authorization"] = f"Bearer {body['token']}"
            client.post("/api/v1/me/consent", json={"version": "1.1", "confirmations": CONFIRMATIONS,
                                                    "typed_signature": "A"})
            assert client.put("/api/v1/me/profile", json={"timezone": "Europe/Berlin"}).status_code == 200
            put_in_arm(engine, body["participant_code"], "control")
            conversation = client.post("/api/v1/me/conversations", json={}).json()["id"]
            survey = client.get("/api/v1/me/surveys").json()[0]["assignment_id"]
            participants.append((client, conversation, survey))

        stop = threading.Event()
        statuses: list[int] = []

        def chat(client: httpx.Client, conversation: int, survey: int, stream: bool) -> None:
            while not stop.is_set():
                try:
                    statuses.append(client.post(f"/api/v1/me/conversations/{conversation}/messages",
                                                params={"stream": "true"} if stream else None,
                                                json={"content": "Should I take the new job?"}).status_code)
                    statuses.append(client.put(f"/api/v1/me/surveys/{survey}/answers",
                                               json={"answers": {"A1": 3}}).status_code)
                except httpx.TransportError:
                    return  # the server went away: that is the point

        threads = [threading.Thread(target=chat, args=(*p, i % 2 == 0), daemon=True)
                   for i, p in enumerate(participants)]
        for thread in threads:
            thread.start()
        time.sleep(1.5)  # replies take 20 s: every participant has a request in flight
        started = time.monotonic()
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=15)
        elapsed = time.monotonic() - started
        stop.set()
        assert elapsed < 5, f"the API took {elapsed:.1f} s to stop after SIGTERM"
        time.sleep(0.5)
        # Requests cut off by the shutdown see the connection close or a 503, never a 500.
        assert 500 not in statuses, statuses
        for client, _, _ in participants:
            client.close()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        log.close()
