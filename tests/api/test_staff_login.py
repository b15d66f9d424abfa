"""Staff sign-in limits: per (email, client) with growing delays, per client across emails, and the
client address taken from X-Forwarded-For only when the peer is a configured proxy."""

from __future__ import annotations

import datetime as dt
from typing import Literal

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from study.clock import FrozenClock
from study.models import StaffRole
from study.settings import get_settings
from tests.builders import load_study, make_staff

EMAIL = "a@example.org"
GOOD = {"email": EMAIL, "password": "correct horse battery"}
WRONG = {"email": EMAIL, "password": "not the password"}
ATTACKER = "203.0.113.66"
OWNER = "198.51.100.7"
PROXY = "10.0.0.2"
LOGIN = "/api/v1/staff/login"


@pytest.fixture
def staff_account(engine: Engine, example_protocol: str) -> None:
    make_staff(engine, load_study(engine, example_protocol), StaffRole.ADMIN, EMAIL)


@pytest.fixture
def trusted_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AFTERWARD_TRUSTED_PROXIES", "10.0.0.0/8, 192.0.2.1")
    get_settings.cache_clear()


def client_at(app_client: TestClient, address: str) -> TestClient:
    """The same app, reached from another socket peer."""
    return TestClient(app_client.app, client=(address, 50000), raise_server_exceptions=False)


def fail(client: TestClient, times: int, **kwargs: object) -> None:
    for _ in range(times):
        response = client.post(LOGIN, json=WRONG, **kwargs)  # type: ignore[arg-type]
        assert response.status_code == 403, response.text


def stored_clients(engine: Engine) -> list[str]:
    with engine.connect() as connection:
        return list(connection.execute(sa.text("SELECT client FROM login_attempts ORDER BY id")).scalars())


@pytest.mark.usefixtures("staff_account", "frozen_clock")
def test_wrong_passwords_from_one_client_do_not_lock_out_another(app_client: TestClient) -> None:
    attacker = client_at(app_client, ATTACKER)
    fail(attacker, get_settings().login_max_failures)

    refused = attacker.post(LOGIN, json=GOOD)  # the right password, but this pair must wait
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "too_many_attempts"
    assert "wait 5 seconds, then try again" in refused.json()["error"]["message"]

    signed_in = client_at(app_client, OWNER).post(LOGIN, json=GOOD)
    assert signed_in.status_code == 200, signed_in.text
    mine = app_client.get("/api/v1/staff/studies", headers={"Authorization": f"Bearer {signed_in.json()['token']}"})
    assert mine.status_code == 200


@pytest.mark.usefixtures("staff_account")
def test_the_wait_doubles_per_failure_up_to_the_cap(
    app_client: TestClient, engine: Engine, frozen_clock: FrozenClock, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AFTERWARD_LOGIN_MAX_DELAY_SECONDS", "30")
    get_settings.cache_clear()
    attacker = client_at(app_client, ATTACKER)
    fail(attacker, 5)
    for wait in (5, 10, 20, 30, 30):
        limited = attacker.post(LOGIN, json=GOOD)
        assert limited.status_code == 429
        assert limited.headers["Retry-After"] == str(wait)
        frozen_clock.advance(dt.timedelta(seconds=wait - 1))
        still = attacker.post(LOGIN, json=WRONG)
        assert still.status_code == 429
        assert still.headers["Retry-After"] == "1"
        frozen_clock.advance(dt.timedelta(seconds=1))
        fail(attacker, 1)  # checked again once the wait is over, and it grows the next wait
    # Only the attempts that were checked are recorded: 5 + one per wait.
    assert len(stored_clients(engine)) == 10


@pytest.mark.usefixtures("staff_account")
def test_after_the_wait_the_pair_may_sign_in_and_success_clears_its_failures(
    app_client: TestClient, frozen_clock: FrozenClock,
) -> None:
    owner = client_at(app_client, OWNER)
    fail(owner, 5)
    assert owner.post(LOGIN, json=GOOD).status_code == 429
    frozen_clock.advance(dt.timedelta(seconds=5))
    assert owner.post(LOGIN, json=GOOD).status_code == 200
    fail(owner, 4)  # counted afresh: without the reset the sixth failure would already mean a wait
    assert owner.post(LOGIN, json=GOOD).status_code == 200


@pytest.mark.usefixtures("staff_account", "frozen_clock")
def test_one_client_cannot_spray_passwords_across_accounts(app_client: TestClient) -> None:
    sprayer = client_at(app_client, ATTACKER)
    for n in range(20):  # four times the per-pair limit, one failure per email
        response = sprayer.post(LOGIN, json={"email": f"staff{n}@example.org", "password": "Winter2026!"})
        assert response.status_code == 403, response.text
    limited = sprayer.post(LOGIN, json={"email": "staff99@example.org", "password": "Winter2026!"})
    assert limited.status_code == 429
    assert int(limited.headers["Retry-After"]) == 5
    assert "from your address" in limited.json()["error"]["message"]
    assert sprayer.post(LOGIN, json=GOOD).status_code == 429
    assert client_at(app_client, OWNER).post(LOGIN, json=GOOD).status_code == 200


@pytest.mark.usefixtures("staff_account", "frozen_clock", "trusted_proxies")
def test_forwarded_for_from_an_untrusted_peer_is_ignored(app_client: TestClient, engine: Engine) -> None:
    attacker = client_at(app_client, ATTACKER)
    for n in range(5):  # a new made-up address on every try
        fail(attacker, 1, headers={"X-Forwarded-For": f"198.51.100.{n + 10}"})
    spoofed = attacker.post(LOGIN, json=GOOD, headers={"X-Forwarded-For": OWNER})
    assert spoofed.status_code == 429
    assert set(stored_clients(engine)) == {ATTACKER}


@pytest.mark.usefixtures("staff_account", "frozen_clock", "trusted_proxies")
def test_forwarded_for_from_a_trusted_proxy_names_the_client(app_client: TestClient, engine: Engine) -> None:
    proxy = client_at(app_client, PROXY)
    fail(proxy, 5, headers={"X-Forwarded-For": ATTACKER})
    assert proxy.post(LOGIN, json=GOOD, headers={"X-Forwarded-For": ATTACKER}).status_code == 429
    # What the client wrote is left of what our proxies appended: it cannot pick another bucket.
    prepended = proxy.post(LOGIN, json=GOOD, headers={"X-Forwarded-For": f"{OWNER}, {ATTACKER}"})
    assert prepended.status_code == 429
    # Through two of our proxies (the second is trusted as a single address), and as IPv4-mapped IPv6.
    chained = proxy.post(LOGIN, json=GOOD, headers={"X-Forwarded-For": f"{ATTACKER}, 192.0.2.1, 10.9.8.7"})
    assert chained.status_code == 429
    assert proxy.post(LOGIN, json=GOOD, headers={"X-Forwarded-For": f"::ffff:{ATTACKER}"}).status_code == 429
    assert proxy.post(LOGIN, json=GOOD, headers={"X-Forwarded-For": OWNER}).status_code == 200
    assert stored_clients(engine) == [ATTACKER] * 5 + [OWNER]


HOSTILE_FORWARDED_FOR = [
    ", ".join(["203.0.113.1"] * 800),  # 10 kB of well-formed addresses
    "9" * 10_000,
    "not-an-address",
    "203.0.113.1:443",
    "fe80::1%eth0",
    "[2001:db8::1]",
    ", ,",
    "unknown, 203.0.113.1 x",
]


@pytest.mark.usefixtures("staff_account", "frozen_clock", "trusted_proxies")
@pytest.mark.parametrize("peer", [PROXY, ATTACKER])
def test_overlong_or_garbage_forwarded_for_gets_a_normal_answer(
    app_client: TestClient, engine: Engine, peer: str,
) -> None:
    client = client_at(app_client, peer)
    for n, value in enumerate(HOSTILE_FORWARDED_FOR):
        headers = {"X-Forwarded-For": value}
        wrong = client.post(LOGIN, json={"email": f"nobody{n}@example.org", "password": "x"}, headers=headers)
        assert wrong.status_code == 403, (value[:40], wrong.text)
        assert client.post(LOGIN, json=GOOD, headers=headers).status_code == 200, value[:40]
    # Ignored, so the peer is recorded: a well-formed address that fits the column.
    assert set(stored_clients(engine)) == {peer}


def test_an_unknown_email_costs_the_same_password_verification_as_a_known_one(
        app_client: TestClient, staff_account: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """No account list by timing: every refused sign-in runs one argon2 verification, against a hash
    of the same parameters, whether the email belongs to an account or not (bench/sign_in.py times it)."""
    from argon2 import PasswordHasher, extract_parameters

    from study import security

    checked: list[str] = []

    class Counting(PasswordHasher):
        def verify(self, hash: str | bytes, password: str | bytes) -> Literal[True]:  # noqa: A002 - argon2's name
            checked.append(str(hash))
            return super().verify(hash, password)

    monkeypatch.setattr(security, "_passwords", Counting())
    answers = []
    for body in (WRONG, {"email": "nobody@example.org", "password": "not the password"},
                 {"email": "nobody@example.org", "password": GOOD["password"]}):
        response = app_client.post(LOGIN, json=body)
        answers.append((response.status_code, response.json()["error"]["code"]))
    assert answers[0] == answers[1] == answers[2]  # and the same answer
    assert len(checked) == 3
    assert all(extract_parameters(h) == extract_parameters(checked[0]) for h in checked)
    assert app_client.post(LOGIN, json=GOOD).status_code == 200
    assert len(checked) == 4
