"""The privacy and audit review's findings on the dashboard, each fixed at its cause: sign-in limits
count the browser behind a trusted proxy (the API's rule, from ``study.client_address``); every
deliberate read is audited, not only the first of a session; the safety queue says how many wait
when it lists only the newest; a new search starts on its first page; a page left open signs out
after the idle limit."""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
import streamlit as st
from sqlalchemy import delete, select
from streamlit.testing.v1 import AppTest
from typer.testing import CliRunner

from api import cli
from dashboard import auth, staff_reads
from study import clock, staff, studies
from study.client_address import UNKNOWN_PEER, resolve, trusted_networks
from study.db import session_scope
from study.models import AuditEntry, LoginAttempt, StaffAccount, StaffRole, StaffToken
from study.safety import SafetyEvent
from study.security import token_digest
from study.settings import get_settings
from tests.builders import TEST_ACTOR, load_study, make_staff
from tests.conftest import EXAMPLE
from tests.dashboard.conftest import EMAILS, PASSWORD, Simulated, open_app, sign_in, visit

pytestmark = pytest.mark.usefixtures("dashboard_env")

PROXY = "10.0.0.5"  # the reverse proxy in front of the dashboard
PAGE_KEY, PER_PAGE = "conversation-page", 50  # dashboard/views/conversations.py's (a page script: not importable)


def audited(simulated: Simulated, action: str, actor: str) -> list[AuditEntry]:
    with session_scope(simulated.engine, read_only=True) as session:
        return list(session.scalars(select(AuditEntry).where(AuditEntry.action == action, AuditEntry.actor == actor)
                                    .order_by(AuditEntry.seq)))


# 1. The client of the sign-in limits


@dataclass
class Browser:
    """What Streamlit knows of a browser's connection (``st.context``): the peer of its socket and
    the headers of the request that opened it. AppTest has no connection, so the tests give one."""

    peer: str | None
    forwarded_for: list[str] = field(default_factory=list)
    cookies: Mapping[str, str] = field(default_factory=dict)

    @property
    def headers(self) -> list[tuple[str, str]]:
        return [("host", "dashboard.uni.example"), *(("x-forwarded-for", value) for value in self.forwarded_for)]

    @property
    def remote_ip(self) -> str | None:
        return self.peer


@pytest.fixture
def connect(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Browser | None], None]]:
    """Serve the dashboard behind the proxy ``PROXY`` (and a proxy on this machine); the returned
    function says which browser's connection the next runs belong to."""
    monkeypatch.setenv("AFTERWARD_TRUSTED_PROXIES", f"{PROXY},127.0.0.1")
    get_settings.cache_clear()
    connected: list[Browser | None] = []
    monkeypatch.setattr("streamlit.runtime.context._get_client_context",
                        lambda: connected[-1] if connected else None)
    yield connected.append
    monkeypatch.delenv("AFTERWARD_TRUSTED_PROXIES")
    get_settings.cache_clear()


def sign_in_from(connect: Callable[[Browser | None], None], browser: Browser, email: str, password: str) -> AppTest:
    connect(browser)
    app = open_app()
    app.text_input[0].input(email)
    app.text_input[1].input(password)
    app.button[0].click().run()
    return app


def stored_clients(simulated: Simulated, email: str) -> list[str]:
    with session_scope(simulated.engine, read_only=True) as session:
        return list(session.scalars(select(LoginAttempt.client).where(LoginAttempt.email == email)
                                    .order_by(LoginAttempt.id)))


def test_browsers_behind_one_proxy_are_limited_each_on_their_own(
        simulated: Simulated, connect: Callable[[Browser | None], None]) -> None:
    email = "proxied@uni.example"  # an account of its own: its failures stay recent under the frozen clock
    make_staff(simulated.engine, simulated.slug, StaffRole.VIEWER, email)
    guesser = Browser(PROXY, ["198.51.100.20"])
    for _ in range(5):
        assert [e.value for e in sign_in_from(connect, guesser, email, "not the password").error] == [auth.WRONG]
    limited = sign_in_from(connect, guesser, email, PASSWORD)
    assert limited.error[0].value.startswith(f"too many failed sign-ins for {email} from your address")
    # Another browser through the same proxy is another client: the owner signs in.
    owner = sign_in_from(connect, Browser(PROXY, ["198.51.100.21"]), email, PASSWORD)
    assert not owner.error
    assert owner.session_state[auth.SESSION_KEY].email == email
    assert stored_clients(simulated, email) == ["198.51.100.20"] * 5 + ["198.51.100.21"]


def test_the_forwarded_address_is_believed_only_from_a_trusted_proxy(
        simulated: Simulated, connect: Callable[[Browser | None], None]) -> None:
    email = "forwarded@uni.example"
    make_staff(simulated.engine, simulated.slug, StaffRole.VIEWER, email)
    # A proxy on this machine (Streamlit gives no address for a loopback peer), trusted as 127.0.0.1;
    # what the client wrote left of the proxy's own entry is not believed.
    sign_in_from(connect, Browser("127.0.0.1", ["192.0.2.99, 203.0.113.9"]), email, "wrong")
    # Straight from the Internet: the made-up header is ignored.
    sign_in_from(connect, Browser("192.0.2.50", ["198.51.100.21"]), email, "wrong")
    # Through the proxy, then through the proxy on this machine; and as IPv4-mapped IPv6.
    sign_in_from(connect, Browser("127.0.0.1", ["203.0.113.10", PROXY]), email, "wrong")
    sign_in_from(connect, Browser(PROXY, ["::ffff:203.0.113.11"]), email, "wrong")
    # A garbled header from the proxy: the proxy is recorded, never the garbage.
    sign_in_from(connect, Browser(PROXY, ["203.0.113.12:443"]), email, "wrong")
    assert stored_clients(simulated, email) == ["203.0.113.9", "192.0.2.50", "203.0.113.10", "203.0.113.11", PROXY]
    connect(None)  # no browser connection (as under AppTest): the placeholder
    assert auth.client_address() == UNKNOWN_PEER


def test_the_api_and_the_dashboard_resolve_by_one_rule() -> None:
    proxies = trusted_networks(("10.0.0.0/8", "192.0.2.1"))
    assert resolve("10.1.2.3", ["198.51.100.7, 192.0.2.1", "10.9.9.9"], proxies) == "198.51.100.7"
    assert resolve("10.1.2.3", ["203.0.113.1, 198.51.100.7"], proxies) == "198.51.100.7"  # right-most untrusted
    assert resolve("198.51.100.8", ["203.0.113.1"], proxies) == "198.51.100.8"  # untrusted peer: header ignored
    assert resolve("10.1.2.3", ["10.2.2.2"], proxies) == "10.1.2.3"  # only proxies: the peer
    assert resolve("10.1.2.3", ["1" * 2000], proxies) == "10.1.2.3"  # overlong
    assert resolve("testclient", [], proxies) == resolve(None, [], proxies) == UNKNOWN_PEER
    assert resolve("fe80::1%eth0", [], proxies) == UNKNOWN_PEER
    import api.client_address

    assert api.client_address.resolve is resolve  # the API's edge only says what the peer and header were


def test_the_dashboard_is_served_without_uvicorns_own_forwarded_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """Streamlit's uvicorn would rewrite a local peer from X-Forwarded-For before the rule above sees
    it; ``afterward dashboard`` turns that off, and refuses a trusted proxy that is not an address."""
    started: list[str | None] = []
    monkeypatch.setattr("os.execv", lambda path, argv: started.append(os.environ.get("FORWARDED_ALLOW_IPS")))
    monkeypatch.setenv("FORWARDED_ALLOW_IPS", "127.0.0.1")  # uvicorn's default, restored afterwards
    result = CliRunner().invoke(cli.app, ["dashboard", "--port", "8599"])
    assert result.exit_code == 0, result.output
    assert started == [""]
    monkeypatch.setenv("AFTERWARD_TRUSTED_PROXIES", "proxy.internal")
    get_settings.cache_clear()
    try:
        refused = CliRunner().invoke(cli.app, ["dashboard"])
    finally:
        monkeypatch.delenv("AFTERWARD_TRUSTED_PROXIES")
        get_settings.cache_clear()
    assert refused.exit_code == 1
    assert "AFTERWARD_TRUSTED_PROXIES: 'proxy.internal' is not an IP address or CIDR" in refused.output
    assert started == [""]


# 2. Every deliberate read is audited


@pytest.fixture
def reader(simulated: Simulated, request: pytest.FixtureRequest) -> str:
    """A researcher of the simulated study with an account of their own, so that what this test
    reads is not counted by the tests that count the shared accounts' audit records."""
    email = f"{request.node.name.removeprefix('test_')[:40].replace('_', '-')}@uni.example"
    make_staff(simulated.engine, simulated.slug, StaffRole.RESEARCHER, email)
    return email


def test_opening_a_transcript_again_is_audited_again(simulated: Simulated, reader: str) -> None:
    email = reader
    listed_before = len(audited(simulated, "conversations.listed", email))
    read_before = len(audited(simulated, "conversation.read", email))

    def reads() -> list[int]:
        return [e.detail["conversation_id"] for e in audited(simulated, "conversation.read", email)[read_before:]]

    app = sign_in(email)
    visit(app, "conversations")
    assert len(audited(simulated, "conversations.listed", email)) == listed_before + 1
    first, second = (int(i) for i in app.dataframe[0].value["id"].iloc[:2])
    chooser = "conversation-open"
    app.selectbox(key=chooser).select(first).run()
    app.run()  # a rerun with the same transcript open (another widget, Refresh) reads nothing again
    assert reads() == [first]
    app.selectbox(key=chooser).select(second).run()
    app.selectbox(key=chooser).select(first).run()
    assert reads() == [first, second, first]
    app.selectbox(key=chooser).select(None).run()  # closed, then opened again
    app.selectbox(key=chooser).select(first).run()
    assert reads() == [first, second, first, first]
    assert len(audited(simulated, "conversations.listed", email)) == listed_before + 1  # the same page all along
    visit(app, "overview")  # away and back: the listing and the transcript are read again
    visit(app, "conversations")
    assert len(audited(simulated, "conversations.listed", email)) == listed_before + 2
    app.selectbox(key=chooser).select(first).run()
    assert not app.exception
    assert reads() == [first, second, first, first, first]


def unreviewed(simulated: Simulated) -> list[int]:
    with session_scope(simulated.engine, read_only=True) as session:
        return list(session.scalars(select(SafetyEvent.id).where(SafetyEvent.reviewed_at.is_(None))
                                    .order_by(SafetyEvent.created_at.desc(), SafetyEvent.id.desc())))


@pytest.fixture
def more_events(simulated: Simulated) -> Iterator[list[int]]:
    """Four more unreviewed safety events, older than the study's own, on a conversation that already
    has one (so no more participants have an event): at least four wait, whichever tests reviewed the
    study's own before; removed afterwards, as the other tests count them."""
    with session_scope(simulated.engine) as session:
        model = session.scalars(select(SafetyEvent).where(SafetyEvent.conversation_id.is_not(None))
                                .order_by(SafetyEvent.created_at)).first()
        assert model is not None, "the simulated study has safety events"
        added = [SafetyEvent(study_id=model.study_id, participant_id=model.participant_id,
                             conversation_id=model.conversation_id, turn_id=model.turn_id, category=model.category,
                             source=model.source, cue=model.cue,
                             created_at=model.created_at - dt.timedelta(minutes=n + 1)) for n in range(4)]
        session.add_all(added)
        session.flush()
        ids = [event.id for event in added]
    yield ids
    with session_scope(simulated.engine) as session:
        session.execute(delete(SafetyEvent).where(SafetyEvent.id.in_(ids)))


@pytest.mark.usefixtures("more_events")
def test_opening_a_safety_event_again_is_audited_again(simulated: Simulated, reader: str) -> None:
    email = reader
    queue = unreviewed(simulated)
    assert len(queue) >= 2
    queue_before = len(audited(simulated, "safety_events.read", email))
    read_before = len(audited(simulated, "safety_event.read", email))

    def reads() -> list[int]:
        return [e.detail["event_id"] for e in audited(simulated, "safety_event.read", email)[read_before:]]

    app = sign_in(email)
    visit(app, "safety")
    assert reads() == [queue[0]]  # the newest is opened with the page
    app.run()
    assert reads() == [queue[0]]
    app.selectbox(key="safety-event").select(queue[1]).run()
    app.selectbox(key="safety-event").select(queue[0]).run()
    assert reads() == [queue[0], queue[1], queue[0]]
    assert len(audited(simulated, "safety_events.read", email)) == queue_before + 1
    visit(app, "overview")
    visit(app, "safety")
    assert reads() == [queue[0], queue[1], queue[0], queue[0]]
    assert len(audited(simulated, "safety_events.read", email)) == queue_before + 2


# 3. The safety queue says how many wait


@pytest.mark.usefixtures("more_events")
def test_the_queue_says_how_many_wait_when_it_lists_only_the_newest(
        simulated: Simulated, reader: str, monkeypatch: pytest.MonkeyPatch) -> None:
    queue = unreviewed(simulated)
    assert len(queue) >= 4
    app = sign_in(reader)
    visit(app, "safety")
    assert not app.warning
    assert f"{len(queue)} safety event(s) wait for review, newest first." in [c.value for c in app.caption]
    monkeypatch.setattr(staff_reads, "QUEUE_LIMIT", len(queue) - 1)
    visit(app, "overview")
    visit(app, "safety")
    assert len(app.selectbox(key="safety-event").options) == len(queue) - 1
    assert app.selectbox(key="safety-event").value == queue[0]
    listed = next(frame.value for frame in app.dataframe if "category" in frame.value.columns)
    assert list(listed["event"]) == queue[:-1]  # the newest
    assert [w.value for w in app.warning] == [
        f"{len(queue)} safety events wait for review; only the newest {len(queue) - 1} are listed here. Older "
        "ones appear as these are reviewed (the staff API lists them all)."]
    entry = audited(simulated, "safety_events.read", reader)[-1]
    assert entry.detail["count"] == len(queue) - 1


# 4. A new search starts on its first page


@pytest.fixture
def second_study(simulated: Simulated) -> str:
    """An empty second study in which the admin of the simulated one is an admin too (an account of
    its own, so that no other test sees two studies)."""
    email = "two-studies@uni.example"
    slug = "second-pilot"
    with session_scope(simulated.engine, read_only=True) as session:
        exists = session.scalar(select(StaffAccount.id).where(StaffAccount.email == email)) is not None
    if not exists:
        protocol = EXAMPLE.read_text(encoding="utf-8").replace("id: wellbeing-pilot", f"id: {slug}", 1)
        load_study(simulated.engine, protocol.replace('  title: "', '  title: "Second pilot, ', 1))
        make_staff(simulated.engine, simulated.slug, StaffRole.ADMIN, email)
        with session_scope(simulated.engine) as session:
            account = session.scalars(select(StaffAccount).where(StaffAccount.email == email)).one()
            staff.grant(session, account, studies.get_study(session, slug), StaffRole.ADMIN, TEST_ACTOR)
    return email


def listing_offsets(simulated: Simulated, email: str) -> list[int]:
    return [e.detail["offset"] for e in audited(simulated, "conversations.listed", email)]


def matched(app: AppTest) -> str:
    return next(c.value for c in app.caption if "conversation(s) match" in c.value)


def test_a_new_search_or_another_study_starts_on_the_first_page(simulated: Simulated, second_study: str) -> None:
    email = second_study
    app = sign_in(email)
    app.sidebar.selectbox(key=auth.STUDY_KEY).set_value(simulated.slug).run()
    visit(app, "conversations")
    assert "page 1 of" in matched(app)
    pages = int(matched(app).split(" of ")[1].split(".")[0])
    assert pages >= 2, "the simulated study has more than a page of conversations"
    app.number_input(key=PAGE_KEY).set_value(2).run()
    assert "page 2 of" in matched(app)
    assert listing_offsets(simulated, email)[-1] == PER_PAGE
    next(s for s in app.selectbox if s.label == "Held in role").select("coach")
    app.button(key="FormSubmitter:conversation-search-Search").click().run()
    assert not app.exception
    assert app.number_input(key=PAGE_KEY).value == 1
    assert listing_offsets(simulated, email)[-1] == 0
    assert app.dataframe, "the new search shows its first page"
    app.number_input(key=PAGE_KEY).set_value(2).run()
    app.sidebar.selectbox(key=auth.STUDY_KEY).set_value("second-pilot").run()
    assert not app.exception
    assert app.title[0].value == "Conversations"
    assert app.number_input(key=PAGE_KEY).value == 1
    assert listing_offsets(simulated, email)[-1] == 0


# 5. A page left open signs out after the idle limit


def test_a_signed_in_page_checks_the_session_on_a_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    registered: list[tuple[Any, Any]] = []
    fragment = st.fragment

    def spy(func: Any = None, **options: Any) -> Any:
        registered.append((func, options.get("run_every")))
        return fragment(func, **options)

    monkeypatch.setattr(st, "fragment", spy)
    app = open_app()
    assert not registered  # nothing to watch on the sign-in page
    app.text_input[0].input(EMAILS[StaffRole.VIEWER])
    app.text_input[1].input(PASSWORD)
    app.button[0].click().run()
    assert not app.exception
    watches = [every for func, every in registered if func is auth.watch]
    assert watches
    assert all(0 < every <= 60 for every in watches)


def tick_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the next run of the app what a timer rerun of the watch fragment runs: ``auth.watch``
    alone, not the page (AppTest runs only whole scripts). Runs after it (the whole page again, when
    the watch asks for it) are the app's own."""
    page = auth.current
    ticked: list[bool] = []

    def tick_then_page() -> auth.StaffSession | None:
        if not ticked:
            ticked.append(True)
            auth.watch()
            st.markdown("tick: still signed in")
            st.stop()
        return page()

    monkeypatch.setattr(auth, "current", tick_then_page)


def test_a_page_left_open_signs_out_after_the_idle_limit(
        simulated: Simulated, reader: str, dashboard_env: clock.FrozenClock, monkeypatch: pytest.MonkeyPatch) -> None:
    app = sign_in(reader)
    visit(app, "conversations")
    assert app.dataframe  # participant-level data on screen
    held = app.session_state[auth.SESSION_KEY]
    seen = held.last_seen_at
    dashboard_env.advance(dt.timedelta(minutes=auth.IDLE_MINUTES - 1))
    with monkeypatch.context() as patch:
        tick_once(patch)
        app.run()
    assert not app.exception
    assert [m.value for m in app.markdown] == ["tick: still signed in"]
    assert app.session_state[auth.SESSION_KEY].last_seen_at == seen  # a tick is not activity
    dashboard_env.advance(dt.timedelta(minutes=2))
    with monkeypatch.context() as patch:
        tick_once(patch)
        app.run()  # the tick finds the idle limit passed and runs the whole page again
    assert not app.exception
    assert app.title[0].value == "Afterward staff dashboard"  # the sign-in page, nothing else
    assert not app.dataframe
    assert "without activity" in app.info[0].value
    assert auth.SESSION_KEY not in app.session_state
    assert staff_reads.READS_KEY not in app.session_state  # what was read went with the session
    with session_scope(simulated.engine, read_only=True) as session:
        revoked = session.scalars(select(StaffToken.revoked_at).where(
            StaffToken.token_sha256 == token_digest(held.token))).one()
    assert revoked is not None


def test_a_simulated_study_is_labelled_in_the_study_list_and_says_so(simulated: Simulated, second_study: str) -> None:
    """Of the two studies, the one made by ``afterward simulate`` is marked in the list, and choosing
    it shows that its participants are synthetic; the live one has neither."""
    with session_scope(simulated.engine, read_only=True) as session:
        assert studies.get_study(session, simulated.slug).simulated
        assert not studies.get_study(session, "second-pilot").simulated
    app = sign_in(second_study)
    chooser = app.sidebar.selectbox(key=auth.STUDY_KEY)
    marked = [label for label in chooser.options if "SIMULATED" in label]
    assert len(marked) == 1
    assert len(chooser.options) == 2
    chooser.set_value(simulated.slug).run()
    assert any("A simulated study" in w.value for w in app.sidebar.info)
    app.sidebar.selectbox(key=auth.STUDY_KEY).set_value("second-pilot").run()
    assert not any("A simulated study" in w.value for w in app.sidebar.info)
