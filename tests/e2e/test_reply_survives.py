"""A reply is never lost to a closed tab: the participant sends a message, closes the tab while the
model is still writing, opens the chat again and finds the reply. The model is held until the
test lets it answer, so "still writing" is a state the test makes, not a race with the clock."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from playwright.sync_api import Browser, Page, expect
from sqlalchemy.engine import Engine

from chat.offline import OfflineLLM
from study.settings import get_settings
from tests.builders import load_study, make_invites, put_in_arm
from tests.e2e.conftest import Camera
from tests.e2e.test_participant_journey import axe_problems, join_and_consent, new_page
from tests.waiting import WAIT_SECONDS, until

MESSAGE = "Should I take the job in Porto?"


def stored_turns(engine: Engine) -> list[str]:
    with engine.connect() as connection:
        return list(connection.execute(sa.text("SELECT speaker FROM turns ORDER BY seq")).scalars())


@pytest.fixture
def answer(live_server: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """The offline model answers (streamed or not) only once this event is set (at the latest when
    the test ends, before the live server stops)."""
    answer = threading.Event()
    complete, stream = OfflineLLM.acompletion, OfflineLLM.astreaming

    async def held_completion(self: OfflineLLM, *args: Any, **kwargs: Any) -> Any:
        await asyncio.to_thread(answer.wait, WAIT_SECONDS)
        return await complete(self, *args, **kwargs)

    async def held_stream(self: OfflineLLM, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        await asyncio.to_thread(answer.wait, WAIT_SECONDS)
        async for chunk in stream(self, *args, **kwargs):
            yield chunk

    monkeypatch.setattr(OfflineLLM, "acompletion", held_completion)
    monkeypatch.setattr(OfflineLLM, "astreaming", held_stream)
    monkeypatch.setenv("AFTERWARD_LLM_TIMEOUT_SECONDS", str(2 * WAIT_SECONDS))  # the hold is not a timeout
    get_settings.cache_clear()
    yield answer
    answer.set()


def coach_chat(browser: Browser, live_server: str, engine: Engine, example_protocol: str) -> Page:
    """A new participant of the well-being arm, in a new conversation with the coach."""
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
    return page


def test_a_draft_typed_while_the_reply_streams_is_kept_when_the_page_shows_the_reply(
    browser: Browser, live_server: str, engine: Engine, example_protocol: str, answer: threading.Event,
) -> None:
    page = coach_chat(browser, live_server, engine, example_protocol)
    box = page.get_by_label("Your message")
    box.fill(MESSAGE)
    page.get_by_role("button", name="Send").click()
    until(lambda: stored_turns(engine) == ["participant"], "the message stored")
    expect(box).to_have_value("")  # on its way: the box is free for the next message
    draft = "and what if the salary is lower? 🤔"
    box.fill(draft)
    page.evaluate("window.typedOnThisDocument = true")
    answer.set()
    # The stream ends and the page is shown again (a new document, without the mark) with the stored reply.
    page.wait_for_function("() => window.typedOnThisDocument === undefined", timeout=WAIT_SECONDS * 1000)
    expect(page.locator(".msg.assistant .bubble")).to_have_count(1)
    expect(page.locator(".msg.participant .bubble")).to_have_text(MESSAGE)
    expect(box).to_have_value(draft)
    # Put back once: the page shown again later starts empty.
    page.reload()
    expect(box).to_have_value("")


def test_a_reply_written_after_the_tab_closed_is_there_when_the_chat_is_opened_again(
    browser: Browser, live_server: str, engine: Engine, example_protocol: str, artifacts: Path,
    answer: threading.Event,
) -> None:
    page = coach_chat(browser, live_server, engine, example_protocol)
    chat = page.url

    page.get_by_label("Your message").fill(MESSAGE)
    page.get_by_role("button", name="Send").click()
    # The message is saved before the model is asked; the model is still writing when the tab closes.
    until(lambda: stored_turns(engine) == ["participant"], "the message stored")
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
    assert stored_turns(engine) == ["participant"]
    answer.set()
    # The page asks until the reply is stored, then shows it.
    reply = again.locator(".msg.assistant .bubble")
    expect(reply).to_have_count(1)
    expect(reply).not_to_be_empty()
    expect(again.get_by_text("still writing its reply")).to_have_count(0)
    expect(again.get_by_role("button", name="Try again")).to_have_count(0)
    camera.shot("reply")
    assert stored_turns(engine) == ["participant", "assistant"]
