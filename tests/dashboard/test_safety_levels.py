"""The safety review queue under Streamlit's AppTest shows every risk finding at its level (a
check-in answered no, an escalation from a "yes, with a plan", a check-in gone unanswered) and,
for the event chosen, its check-in: each question with the answer and how it was given."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest
import streamlit as st
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from dashboard import data
from scheduler.dispatcher import Dispatcher
from study.clock import FrozenClock
from study.models import StaffRole
from study.settings import Settings, get_settings
from tests.builders import enroll_fully, load_study, make_invites, make_staff, put_in_arm, say, start_chat
from tests.dashboard.test_oncall_link import follow, texts

RESEARCHER = "clinician@uni.example"
HOPELESS = "I feel hopeless, like I'm falling apart"


@pytest.fixture
def three_levels(engine: Engine, app_client: TestClient, example_protocol: str, frozen_clock: FrozenClock,
                 monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    slug = load_study(engine, example_protocol)
    for answers in (["no", "no", "no"], ["yeah i have a plan"], []):
        [invite] = make_invites(engine, slug)
        who = enroll_fully(app_client, invite)
        put_in_arm(engine, who.code, "wellbeing")
        conversation = start_chat(app_client, who, "concierge")
        say(app_client, who, conversation, HOPELESS)
        for text in answers:
            say(app_client, who, conversation, text)
        frozen_clock.advance(dt.timedelta(minutes=1))
    frozen_clock.advance(dt.timedelta(minutes=30))  # the last one's answers are past due
    assert Dispatcher(engine, Settings(), channels={}).tick().unanswered == 1
    make_staff(engine, slug, StaffRole.RESEARCHER, RESEARCHER)
    monkeypatch.setenv("AFTERWARD_DATABASE_URL", engine.url.render_as_string(hide_password=False))
    get_settings.cache_clear()
    st.cache_data.clear()
    data._generations.clear()
    yield slug
    st.cache_data.clear()


def test_the_queue_shows_each_event_at_its_level_with_its_check_in_answers(three_levels: str) -> None:
    app = follow({}, RESEARCHER)
    listing = app.dataframe[0].value
    assert list(listing["event"]) == [3, 2, 1]  # newest first
    assert list(listing["level"]) == ["unanswered check-in (paging)", "escalation (paging)", "check-in"]
    assert list(listing["check-in"]) == ["not answered in time", "intent, plan or recent act", "all no"]
    chooser = app.selectbox(key="safety-event")
    assert [option.split(" · ")[1] for option in chooser.options] == [
        "unanswered check-in", "escalation", "check-in"]

    chooser.set_value(1)
    app.run()
    shown = texts(app)
    assert "**Level:** check-in" in shown
    assert "**Check-in** (risk to self): answered · the answers say: all no" in shown
    # Each question with its answer and how it was given (read from the participant's messages here).
    assert "- In the past month, have you wished you weren't alive anymore? **No** (words, 09:00 UTC)" in shown
    assert "- Have you made a plan, with details worked out, that you mean to go through with? *not answered*" in shown

    chooser = app.selectbox(key="safety-event")
    chooser.set_value(3)
    app.run()
    shown = texts(app)
    assert "**Level:** unanswered check-in (paging)" in shown
    assert "the participant was shown the follow-up" in shown  # the example protocol follows up
    assert "**Yes**" not in shown
    assert "**No**" not in shown
