"""Staff sign-in time for an unknown email against a known email with a wrong password, in the same
run: an attacker must not tell them apart (issue 23: 8-13 ms against 144-180 ms before the unknown
email ran the same argon2 verification).

    .venv/bin/python bench/sign_in.py [--n 50]

Each attempt is a full request through the API in process (TestClient) on a fresh SQLite database,
from its own client address (so the failure limits never delay one). Unknown and known attempts
alternate, so both meet the same load. Prints the medians and their ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from common import PROTOCOL  # first: sets the environment and sys.path
from fastapi.testclient import TestClient

from api.app import create_app
from study.db import make_engine, migrate
from study.models import StaffRole
from tests.builders import load_study, make_staff

KNOWN = "researcher@example.org"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=50, help="attempts of each kind")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        url = f"sqlite:///{Path(directory) / 'bench.db'}"
        os.environ["AFTERWARD_DATABASE_URL"] = url
        migrate(url)
        engine = make_engine(url)
        make_staff(engine, load_study(engine, PROTOCOL.read_text()), StaffRole.RESEARCHER, KNOWN)
        app = create_app(engine)
        times: dict[str, list[float]] = {"unknown email": [], "known email, wrong password": []}
        emails = {"unknown email": "nobody@example.org", "known email, wrong password": KNOWN}
        for i in range(args.n * 2 + 2):
            kind = list(times)[i % 2]
            with TestClient(app, client=(f"198.51.{i // 250}.{i % 250 + 1}", 50000)) as client:
                started = time.perf_counter()
                response = client.post("/api/v1/staff/login", json={"email": emails[kind], "password": "wrong one"})
                elapsed = time.perf_counter() - started
            assert response.status_code == 403, response.text
            if i >= 2:  # the first of each warms up
                times[kind].append(elapsed * 1000)
        engine.dispose()
    medians = {kind: statistics.median(values) for kind, values in times.items()}
    print(f"load at start: {os.getloadavg()[0]:.2f}; {args.n} attempts of each kind, alternating")
    for kind, values in times.items():
        print(f"  {kind:<28} median {medians[kind]:.1f} ms, p90 {statistics.quantiles(values, n=10)[-1]:.1f} ms")
    low, high = sorted(medians.values())
    print(f"  ratio of the medians: {high / low:.3f} (within 20%: {high / low <= 1.2})")


if __name__ == "__main__":
    main()
