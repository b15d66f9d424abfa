"""Property-based API testing: schemathesis against the real API on PostgreSQL, with every check.

A fresh PostgreSQL schema is migrated and given the example study, a staff admin with a token,
one participant enrolled through the API and a second one left at the consent step. The API then
runs under uvicorn on a free loopback port, and schemathesis explores /openapi.json as the
participant (every operation but the staff ones) and as the staff admin (the staff ones): every
check it has (server errors, status codes, headers and bodies against the document, the Allow
header, schema-valid data accepted and invalid data refused, authentication enforced, ...) in
every phase, the stateful one included (sequences of calls along the links it infers between
operations). A schema-valid request refused with 422 must carry a code its operation documents as
a rule about the study's data (tests/contract/hooks.py). The run is seeded and bounded (examples
per operation; a pass is stopped when no request reaches the server for a while, a hang, not when a
busy machine is slow); the server's log, with the traceback of every server
error, is kept in var/contract/ and printed when something failed.

Run from the project root (not collected by pytest; .ci/run calls it):

    .venv/bin/python -m tests.contract.run_schemathesis

PostgreSQL is at AFTERWARD_CI_POSTGRES_URL (default postgresql+psycopg://postgres@127.0.0.1:5432/test).
Exit status: 0 when schemathesis found nothing, no response was a 5xx and the server stayed up, 1
otherwise, 2 when the harness itself could not set up.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import sqlalchemy as sa

from tests.builders import CONFIRMATIONS
from tests.mail import free_port
from tests.postgres import scratch_schema
from tests.waiting import WAIT_SECONDS, answers, until

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "wellbeing-pilot.yaml"
OUTPUT = Path(os.environ.get("AFTERWARD_CONTRACT_OUTPUT", ROOT / "var" / "contract"))
DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"

SEED = int(os.environ.get("AFTERWARD_CONTRACT_SEED", "20260302"))
MAX_EXAMPLES = int(os.environ.get("AFTERWARD_CONTRACT_MAX_EXAMPLES", "30"))
# A pass is stopped and counted as a failure (a hang is a finding too) when no request has reached
# the server for this long: far above a request's own limit, so a slow machine is not a hang. The
# total cap only bounds a run that never stops making requests.
STALL_SECONDS = float(os.environ.get("AFTERWARD_CONTRACT_STALL", "120"))
PASS_CAP_SECONDS = float(os.environ.get("AFTERWARD_CONTRACT_PASS_CAP", "3600"))
REQUEST_TIMEOUT_SECONDS = 10.0
SERVER_START_SECONDS = WAIT_SECONDS

# Operations that end the caller's own access. Explored last, in a pass of their own, so they do
# not turn the rest of the run into a series of 401/403 answers.
SELF_ENDING = [
    ("POST", "/api/v1/me/withdrawal"),
]
HOOKS = Path(__file__).resolve().parent / "hooks.py"
# What a schema-valid request may be answered with: schemathesis's default, and 410 (gone: a closed
# survey) and 422 (a rule about the study's data, checked by code in HOOKS).
ACCEPTED_STATUSES = ["2xx", "3xx", "401", "403", "404", "409", "410", "422", "429", "5xx"]
# The staff side (its login included); the participant passes take every other operation.
STAFF_PATHS = "^/api/v1/staff/"


def report(line: str = "") -> None:
    print(line, flush=True)  # noqa: T201 - a CI stage reports on stdout


@dataclass
class Known:
    """Credentials, and ids that exist, so generated requests reach past the 404s of random ids."""

    staff_token: str
    participant_token: str
    slugs: list[str]
    assignment_ids: list[int]
    instrument_ids: list[str]
    conversation_ids: list[int]
    turn_ids: list[int]
    event_ids: list[int] = field(default_factory=list)
    link_tokens: list[str] = field(default_factory=list)  # signed survey links (/survey-links/{token})


@dataclass
class PassResult:
    name: str
    exit_code: int | None  # None: stopped at the time limit
    seconds: float
    failing: list[str]  # the operations in the failures section of schemathesis's report
    cases: str  # schemathesis's count, e.g. "5702 generated, 5702 passed, 51 skipped"


def prepare_database(url: str) -> tuple[str, str, list[str]]:
    """Migrate, load the example study, create a staff admin; returns the study's slug, the admin's
    token and two invites."""
    from study import audit, participants, staff, studies
    from study.db import make_engine, migrate, session_scope
    from study.models import StaffRole
    from surveys import registry

    migrate(url)
    actor = audit.Actor.system("contract-tests")
    engine = make_engine(url)
    try:
        with session_scope(engine) as session:
            study = studies.load_protocol(session, EXAMPLE.read_text(encoding="utf-8"), actor,
                                          instruments=registry.catalog(session)).study
            account = staff.create_staff(session, email="contract-admin@example.org", name="Contract admin",
                                         password="contract tests password", actor=actor)
            staff.grant(session, account, study, StaffRole.ADMIN, actor)
            token = staff.issue_token(session, account, "contract", actor)
            invites = participants.create_invites(session, study, actor, count=2)
            slug = study.slug
    finally:
        engine.dispose()
    return slug, token, invites


def put_in_arm(database_url: str, participant_token: str, arm: str) -> None:
    """Override the randomization, so every run explores the same arm (the one with roles and pushback)."""
    from study import participants
    from study.db import make_engine, session_scope

    engine = make_engine(database_url)
    try:
        with session_scope(engine) as session:
            participant = participants.participant_for_token(session, participant_token)
            assert participant is not None
            participant.arm = arm
    finally:
        engine.dispose()


def survey_links(database_url: str, assignment_ids: list[int]) -> list[str]:
    """The signed links the emails would carry for these surveys."""
    from study.db import make_engine, session_scope
    from surveys import service
    from surveys.models import SurveyAssignment

    engine = make_engine(database_url)
    try:
        with session_scope(engine) as session:
            return [service.link_token(session.get_one(SurveyAssignment, i)) for i in assignment_ids]
    finally:
        engine.dispose()


def make_known(base_url: str, database_url: str, invites: list[str], staff_token: str, slug: str) -> Known:
    """Through the running API: one participant fully enrolled in the wellbeing arm (with a
    conversation, one exchange and a safety event) and one who has not signed consent yet."""
    with httpx.Client(base_url=base_url, timeout=REQUEST_TIMEOUT_SECONDS, trust_env=False) as client:
        tokens = []
        for invite in invites:
            response = expect(client.post("/api/v1/enrollment", json={"invite_code": invite}), 201)
            tokens.append(response.json()["token"])
            client.cookies.clear()  # bearer tokens only: a cookie would ask for CSRF tokens
        enrolled = {"Authorization": f"Bearer {tokens[0]}"}
        expect(client.post("/api/v1/me/consent", headers=enrolled, json={
            "version": "1.2", "confirmations": CONFIRMATIONS, "typed_signature": "Contract Tester",
        }), 201)
        expect(client.put("/api/v1/me/profile", headers=enrolled, json={
            "timezone": "Europe/Berlin", "contact_email": "participant@example.org",
        }), 200)
        put_in_arm(database_url, tokens[0], "wellbeing")
        surveys = expect(client.get("/api/v1/me/surveys", headers=enrolled), 200).json()
        known = Known(staff_token, tokens[0], [slug], [s["assignment_id"] for s in surveys],
                      sorted({s["instrument"] for s in surveys}), [], [])
        known.link_tokens = survey_links(database_url, known.assignment_ids)
        # A conversation helps explore the chat operations, but the run goes on without one: an
        # error here is in the server's log and fails the stage anyway.
        started = client.post("/api/v1/me/conversations", headers=enrolled, json={"role": "collaborator"})
        if started.status_code != 201:
            report(f"note: could not start a conversation ({started.status_code}); chat ids will be random")
            return known
        known.conversation_ids.append(started.json()["id"])
        exchange = client.post(f"/api/v1/me/conversations/{known.conversation_ids[0]}/messages",
                               params={"stream": "false"}, headers=enrolled,
                               json={"content": "Should I take the job in another city?"})
        if exchange.status_code == 200:
            known.turn_ids.append(exchange.json()["reply"]["id"])
        else:
            report(f"note: could not exchange a message ({exchange.status_code}); turn ids will be random")
        # A message the crisis monitor flags gives the staff a safety event to review.
        client.post(f"/api/v1/me/conversations/{known.conversation_ids[0]}/messages", params={"stream": "false"},
                    headers=enrolled, json={"content": "I want to kill myself tonight."})
        events = client.get(f"/api/v1/staff/studies/{slug}/safety-events",
                            headers={"Authorization": f"Bearer {staff_token}"})
        known.event_ids = [event["id"] for event in events.json()] if events.status_code == 200 else []
        if not known.event_ids:
            report(f"note: no safety event to review ({events.status_code}); event ids will be random")
    return known


def write_config(known: Known, path: Path) -> None:
    """A schemathesis.toml that draws path parameters from ids that exist most of the time (the rest
    stay generated, so odd values are still tried)."""
    bindings = {"slug": known.slugs, "assignment_id": known.assignment_ids,
                "instrument_id": known.instrument_ids, "conversation_id": known.conversation_ids,
                "turn_id": known.turn_ids, "event_id": known.event_ids, "token": known.link_tokens}
    # No cache of earlier runs' failures: every run is the same run for one seed. A schema-valid
    # request refused with 422 is judged by the code it carries (tests/contract/hooks.py).
    lines = ["[cache]", "enabled = false", "", "[checks.positive_data_acceptance]",
             f"expected-statuses = {json.dumps(ACCEPTED_STATUSES)}", "", "[parameters]"]
    lines += [f'"path.{name}" = {{ dictionary = "{name}", probability = 0.7 }}'
              for name, values in bindings.items() if values]
    for name, values in bindings.items():
        if values:
            lines += ["", f"[dictionaries.{name}]", f"values = {json.dumps(values)}"]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def expect(response: httpx.Response, status: int) -> httpx.Response:
    if response.status_code != status:
        raise RuntimeError(f"{response.request.method} {response.request.url.path} answered "
                           f"{response.status_code}, not {status}: {response.text[:500]}")
    return response


@contextmanager
def api_server(database_url: str, port: int, log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The real API under uvicorn in a subprocess, its output in ``log_path``; always stopped."""
    env = dict(os.environ, AFTERWARD_DATABASE_URL=database_url, AFTERWARD_ENVIRONMENT="test",
               LITELLM_LOCAL_MODEL_COST_MAP="True", NO_PROXY="127.0.0.1,localhost")
    command = [str(ROOT / ".venv" / "bin" / "afterward"), "api", "--host", "127.0.0.1", "--port", str(port)]
    with log_path.open("wb") as log:
        server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
        try:
            wait_until_up(server, f"http://127.0.0.1:{port}")
            yield server
        finally:
            stop(server)


def wait_until_up(server: subprocess.Popen[bytes], base_url: str) -> None:
    until(lambda: answers(f"{base_url}/healthz"), "the API to answer /healthz", timeout=SERVER_START_SECONDS,
          processes=[server])


def stop(server: subprocess.Popen[bytes]) -> None:
    if server.poll() is not None:
        return
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        # Only our own process group (start_new_session): uvicorn and anything it started.
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def server_alive(server: subprocess.Popen[bytes], base_url: str) -> bool:
    if server.poll() is not None:
        return False
    try:
        return httpx.get(f"{base_url}/healthz", timeout=5, trust_env=False).status_code == 200
    except httpx.TransportError:
        return False


def run_pass(name: str, base_url: str, token: str, config: Path, selection: list[str],
             server_log: Path) -> PassResult:
    """One schemathesis run as one caller over the operations ``selection`` (schemathesis's
    --include-*/--exclude-* options) picks; the report (with a curl line per failure) goes to stdout."""
    st = Path(sys.executable).parent / "st"
    command = [
        str(st), "--config-file", str(config), "run", f"{base_url}/openapi.json",
        "--header", f"Authorization: Bearer {token}",
        "--checks", "all",
        "--max-examples", str(MAX_EXAMPLES),
        "--seed", str(SEED),
        "--workers", "1",
        "--phases", "examples,coverage,fuzzing,stateful",
        "--continue-on-failure",
        "--suppress-health-check", "all",
        "--generation-database", "none",
        "--request-timeout", str(REQUEST_TIMEOUT_SECONDS),
        "--max-redirects", "0",
        "--no-color",
        "--output-sanitize", "true",
    ]
    command += selection
    env = dict(os.environ, NO_PROXY="127.0.0.1,localhost", COLUMNS="160", SCHEMATHESIS_HOOKS=str(HOOKS))
    report(f"== schemathesis: {name}")
    started = time.monotonic()
    with tempfile.TemporaryFile("w+", encoding="utf-8") as captured:
        process = subprocess.Popen(command, cwd=OUTPUT, env=env, stdout=captured, stderr=subprocess.STDOUT, text=True)
        exit_code = _wait_while_served(process, server_log, started)
        captured.seek(0)
        output = captured.read()
    seconds = time.monotonic() - started
    report(output.rstrip())
    cases = re.search(r"^Test cases:\n +(.+)$", output, flags=re.MULTILINE)
    return PassResult(name, exit_code, seconds, failing_operations(output), cases.group(1) if cases else "?")


def _wait_while_served(process: subprocess.Popen[str], server_log: Path, started: float) -> int | None:
    """``process``'s exit code, or None when it was stopped: no request reached the server (its log
    did not grow) for ``STALL_SECONDS``, or the pass ran ``PASS_CAP_SECONDS`` in all."""
    size, last_growth = -1, time.monotonic()
    while True:
        try:
            return process.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        grown = server_log.stat().st_size if server_log.exists() else 0
        if grown != size:
            size, last_growth = grown, now
        if now - last_growth > STALL_SECONDS or now - started > PASS_CAP_SECONDS:
            process.kill()
            process.wait(timeout=30)
            return None


def failing_operations(output: str) -> list[str]:
    """The operations schemathesis reported a failure for (its '_____ METHOD /path _____' headings)."""
    headings = re.findall(r"^_+ (\S+ \S+) _+$", output, flags=re.MULTILINE)
    return list(dict.fromkeys(headings))


ACCESS_5XX = re.compile(r'^INFO: +\S+ - "(\S+ \S+) HTTP/[\d.]+" (5\d\d)\b')
LOG_RECORD_START = re.compile(r"^(INFO|WARNING|ERROR):|^unhandled error$")


@dataclass
class ServerError:
    request: str  # "METHOD /path?query 500", the first request that raised it
    exception: str
    frames: list[str]  # the traceback's frames in our own code, outermost first
    count: int = 1


def server_errors(log_path: Path) -> tuple[list[ServerError], int]:
    """What the server log says about 5xx answers: each distinct error (by the exception and the
    frames of our code) with the first request that raised it, and the number of 5xx answers."""
    lines = log_path.read_text(encoding="utf-8", errors="replace").splitlines()
    errors: dict[tuple[str, ...], ServerError] = {}
    answered_5xx = 0
    pending: tuple[str, list[str]] | None = None  # an "unhandled error" waiting for its access-log line
    for number, line in enumerate(lines):
        access = ACCESS_5XX.match(line)
        if access:
            answered_5xx += 1
            exception, frames = pending if pending else ("(no traceback logged by the app)", [])
            # Keyed by file and function, not line: one error reached by many requests is one finding.
            key = (exception[:200], *(re.sub(r":\d+ in (\S+):.*", r" \1", frame) for frame in frames))
            if key in errors:
                errors[key].count += 1
            else:
                errors[key] = ServerError(f"{access.group(1)} {access.group(2)}", exception, frames)
            pending = None
        elif line == "unhandled error":
            record = []
            for following in lines[number + 1:]:
                if LOG_RECORD_START.match(following):
                    break
                record.append(following)
            pending = summarize_traceback(record)
    return list(errors.values()), answered_5xx


def summarize_traceback(record: list[str]) -> tuple[str, list[str]]:
    """The final exception line and our own frames ("file:line in function: code") of a logged traceback."""
    frame_at = [i for i, line in enumerate(record) if line.startswith('  File "')]
    last_chain = max((i for i, line in enumerate(record) if line.startswith("Traceback")), default=0)
    frames = []
    for i in frame_at:
        match = re.match(r'  File "([^"]+)", line (\d+), in (.+)', record[i])
        if i < last_chain or not match or "/.venv/" in match.group(1) or not match.group(1).startswith(str(ROOT)):
            continue
        code = record[i + 1].strip() if i + 1 < len(record) else ""
        frames.append(f"{Path(match.group(1)).relative_to(ROOT)}:{match.group(2)} in {match.group(3)}: {code}")
    after_frames = frame_at[-1] + 1 if frame_at else 0
    exception = next((line for line in record[after_frames:] if line and not line.startswith(" ")), "?")
    return exception, frames


def main() -> int:
    admin_url = os.environ.get("AFTERWARD_CI_POSTGRES_URL", DEFAULT_POSTGRES_URL)
    os.environ["AFTERWARD_ENVIRONMENT"] = "test"
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    if shutil.which("st", path=str(Path(sys.executable).parent)) is None:
        report("FAIL: schemathesis is not installed in this environment (pip install -e '.[dev]')")
        return 2
    # CI stopping this script must still stop the server (the finally clauses run on SystemExit).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    OUTPUT.mkdir(parents=True, exist_ok=True)
    log_path = OUTPUT / "api-server.log"
    results: list[PassResult] = []
    server_survived = True
    started = time.monotonic()
    try:
        with scratch_schema(admin_url, "afterward_contract") as database_url:
            os.environ["AFTERWARD_DATABASE_URL"] = database_url  # the services below read the same settings
            slug, staff_token, invites = prepare_database(database_url)
            port = free_port()
            base_url = f"http://127.0.0.1:{port}"
            with api_server(database_url, port, log_path) as server:
                known = make_known(base_url, database_url, invites, staff_token, slug)
                config = OUTPUT / "schemathesis.toml"
                write_config(known, config)
                self_ending = [f"{method} {path}" for method, path in SELF_ENDING]
                passes = [
                    ("participant", known.participant_token,
                     ["--exclude-path-regex", STAFF_PATHS, *(a for n in self_ending for a in ("--exclude-name", n))]),
                    ("staff", known.staff_token, ["--include-path-regex", STAFF_PATHS]),
                    ("participant, operations that end its own access", known.participant_token,
                     [a for n in self_ending for a in ("--include-name", n)]),
                ]
                for name, token, selection in passes:
                    results.append(run_pass(name, base_url, token, config, selection, log_path))
                    if not server_alive(server, base_url):
                        server_survived = False
                        report(f"FAIL: the API stopped answering /healthz after the {name} pass")
                        break
    except (sa.exc.SQLAlchemyError, httpx.HTTPError, RuntimeError) as exc:
        report(f"FAIL: the contract-test harness could not set up: {exc}")
        if log_path.exists():
            report(log_path.read_text(encoding="utf-8", errors="replace")[-5000:])
        return 2

    report()
    report(f"== schemathesis summary (seed {SEED}, {MAX_EXAMPLES} examples per operation, "
           f"{time.monotonic() - started:.0f} s)")
    failed = not server_survived
    for result in results:
        if result.exit_code is None:
            verdict = (f"stopped: no request reached the server for {STALL_SECONDS:.0f} s, or the pass ran "
                       f"{PASS_CAP_SECONDS:.0f} s")
        elif result.exit_code == 0:
            verdict = "no failures"
        elif result.failing:
            verdict = f"failures in {len(result.failing)} operation(s)"
        else:
            verdict = f"schemathesis exited with {result.exit_code} (see its output above)"
        report(f"  {result.name}: {verdict} ({result.seconds:.0f} s; test cases: {result.cases})")
        for operation in result.failing:
            report(f"      {operation}")
        failed = failed or result.exit_code != 0
    errors, answered_5xx = server_errors(log_path)
    if answered_5xx:
        failed = True
        report(f"== the server answered 5xx {answered_5xx} time(s); {len(errors)} distinct error(s) "
               f"(full tracebacks: {log_path})")
        for error in errors:
            report(f"  {error.request}  (x{error.count})")
            report(f"    {error.exception[:400]}")
            for frame in error.frames:
                report(f"      {frame[:200]}")
    report("schemathesis: FAILED" if failed else "schemathesis: no failures")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
