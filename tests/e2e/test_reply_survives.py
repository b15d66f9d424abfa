"""A reply is never lost to a closed tab: the participant sends a message, closes the tab a second
later while the model is still writing, opens the chat again and finds the reply."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from playwright.sync_api import Browser, expect
from sqlalchemy.engine import Engine

from study.settings import get_settings
from tests.builders import load_study, make_invites, put_in_arm
from tests.e2e.conftest import Camera
from tests.e2e.test_participant_journey import axe_problems, join_and_consent, new_page

MESSAGE = "Should I take the job in Porto?"


def stored_turns(engine: Engine) -> list[str]:
    with engine.connect() as connection:
        return list(connection.execute(sa.text("SELECT speaker FROM turns ORDER BY seq")).scalars())


def test_a_reply_written_after_the_tab_closed_is_there_when_the_chat_is_opened_again(
    browser: Browser, live_server: str, engine: Engine, example_protocol: str, artifacts: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AFTERWARD_OFFLINE_LLM_DELAY_MS", "6000")  # the model takes 6 s to answer
    get_settings.cache_clear()
    [invite] = make_invites(engine, load_study(engine, example_protocol))
    page = new_page(browser, bypass_csp=True)  # axe runs on the page opened again
    join_and_consent(page, live_server, invite)
    page.get_by_role("button", name="Save and continue").click()
    with engine.connect() as connection:
        code = connection.execute(sa.text("SELECT code FROM participants")).scalar_one()
    put_in_arm(engine, code, "wellbeing")
    page.goto(live_server + "/chat")
    page.get_by_role("button", name="Choose Coach").click()
    expect(page.get_by_label("Your message")).to_be_visible()
    chat = page.url

    page.get_by_label("Your message").fill(MESSAGE)
    sent = time.monotonic()
    page.get_by_role("button", name="Send").click()
    deadline = sent + 10
    while stored_turns(engine) != ["participant"]:  # the message is saved before the model is asked
        assert time.monotonic() < deadline, "the message was never stored"
        time.sleep(0.05)
    page.wait_for_timeout(max(0.0, 1.0 - (time.monotonic() - sent)) * 1000)  # one second after Send
    assert stored_turns(engine) == ["participant"]  # the model is still writing
    context = page.context
    page.close()

    again = context.new_page()
    camera = Camera(again, artifacts, "reply-survives")
    again.goto(chat)
    expect(again.locator(".msg.participant .bubble")).to_have_text(MESSAGE)
    notice = again.get_by_role("status")
    expect(notice).to_contain_text("The assistant is still writing its reply; it is saved even if you leave.")
    assert axe_problems(again) == []
    camera.shot("still-writing")
    # The page asks until the reply is stored, then shows it.
    reply = again.locator(".msg.assistant .bubble")
    expect(reply).to_have_count(1, timeout=30_000)
    expect(reply).not_to_be_empty()
    expect(again.get_by_text("still writing its reply")).to_have_count(0)
    expect(again.get_by_role("button", name="Try again")).to_have_count(0)
    camera.shot("reply")
    assert stored_turns(engine) == ["participant", "assistant"]
