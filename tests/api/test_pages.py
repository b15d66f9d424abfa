"""Participant pages without a browser: security headers, CSRF, re-consent, closed surveys, and how
the chat page and /help show pushback and crisis resources."""

from __future__ import annotations

import datetime as dt
import html
import re
import subprocess
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

import api
from api.deps import SESSION_COOKIE
from api.pages import resources_html
from chat import service as chat_service
from chat.models import Conversation
from study import processes
from study.clock import FrozenClock
from study.db import session_scope
from study.models import Participant
from tests.builders import FRAMING, assign_survey, csrf_of, enroll_fully, join, load_study, make_invites, put_in_arm


def sign(client: TestClient, html: str, version: str = "1.2") -> None:
    signed = client.post("/consent", data={
        "csrf": csrf_of(html), "version": version, "typed_signature": "A",
        "confirmations": ["read-and-understood", "adult", "voluntary"]}, follow_redirects=False)
    assert signed.status_code == 303, signed.text


def test_pages_send_a_strict_content_security_policy(app_client: TestClient) -> None:
    response = app_client.get("/")
    assert response.status_code == 200
    csp = response.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp
    assert "unsafe-inline" not in csp
    assert response.headers["Referrer-Policy"] == "no-referrer"
    assert "<script>" not in response.text
    assert "style=" not in response.text
    explorer = app_client.get("/docs").headers["Content-Security-Policy"]  # the API explorer keeps working,
    assert "script-src 'self' 'unsafe-inline'" in explorer  # with its inline script, but nothing from elsewhere
    assert "default-src 'self'" in explorer


def test_forms_without_the_csrf_token_are_refused(engine: Engine, app_client: TestClient,
                                                  example_protocol: str) -> None:
    [invite] = make_invites(engine, load_study(engine, example_protocol))
    forged = app_client.post("/join", data={"pre": "guess", "invite_code": invite}, follow_redirects=False)
    assert (forged.status_code, forged.headers["location"]) == (303, "/?expired=1")
    html = join(app_client, invite)
    refused = app_client.post("/consent", data={"csrf": "0" * 64, "version": "1.2", "typed_signature": "A",
                                                "confirmations": ["read-and-understood", "adult", "voluntary"]},
                              follow_redirects=False)
    assert refused.headers["location"] == "/?expired=1"
    sign(app_client, html)
    assert app_client.get("/", follow_redirects=False).headers["location"] == "/onboarding"


def test_an_optional_confirmation_is_shown_as_optional_and_may_be_ticked(
    engine: Engine, app_client: TestClient, example_protocol: str,
) -> None:
    [invite] = make_invites(engine, load_study(engine, example_protocol))
    html = join(app_client, invite)
    box = re.search(r'<input type="checkbox" id="confirm-share-conversation-text"[^>]*>', html)
    assert box, html
    assert "required" not in box.group(0)  # it can be left unticked ...
    assert 'id="confirm-adult" name="confirmations" value="adult" required' in html  # ... unlike these
    assert "(optional)" in html
    signed = app_client.post("/consent", data={
        "csrf": csrf_of(html), "version": "1.2", "typed_signature": "A",
        "confirmations": ["read-and-understood", "adult", "voluntary", "share-conversation-text"]},
        follow_redirects=False)
    assert signed.status_code == 303, signed.text
    copy = app_client.get("/api/v1/me/consent/signed").json()
    assert "share-conversation-text" in copy["confirmations"]


def test_a_revised_consent_is_shown_and_signed_again(engine: Engine, app_client: TestClient,
                                                     example_protocol: str) -> None:
    slug = load_study(engine, example_protocol)
    [invite] = make_invites(engine, slug)
    sign(app_client, join(app_client, invite))
    onboarding = app_client.get("/onboarding")
    app_client.post("/onboarding", data={"csrf": csrf_of(onboarding.text), "timezone": "Europe/Paris"})
    revised = example_protocol.replace('version: "1.2"', 'version: "2.0"').replace(
        "answer a few short questionnaires", "answer a few short questionnaires and one interview")
    load_study(engine, revised)
    assert app_client.get("/chat", follow_redirects=False).headers["location"] == "/consent"
    page = app_client.get("/consent")
    assert "The consent was revised" in page.text
    assert "one interview" in page.text
    sign(app_client, page.text, version="2.0")
    assert app_client.get("/chat").status_code == 200


def test_a_closed_or_finished_survey_says_so(engine: Engine, app_client: TestClient, example_protocol: str,
                                             frozen_clock: FrozenClock) -> None:
    [invite] = make_invites(engine, load_study(engine, example_protocol))
    sign(app_client, join(app_client, invite))
    onboarding = app_client.get("/onboarding")
    app_client.post("/onboarding", data={"csrf": csrf_of(onboarding.text), "timezone": "Europe/Paris"})
    code = re.search(r"<strong>(P[0-9A-Z]+)</strong>", app_client.get("/me").text)
    assert code
    survey = assign_survey(engine, code.group(1), "goal-progress",
                           closes_at=frozen_clock.now() + dt.timedelta(days=1))
    page = app_client.get(f"/surveys/{survey}")
    assert "Part 1 of 1" in page.text
    answered = app_client.post(f"/surveys/{survey}", data={"csrf": csrf_of(page.text), "step": "0",
                                                           "progress": "12", "go": "submit"})
    assert answered.status_code == 422  # out of range: the page names the problem
    assert "must be between" in answered.text
    done = app_client.post(f"/surveys/{survey}", data={"csrf": csrf_of(page.text), "step": "0",
                                                       "progress": "6", "go": "submit"}, follow_redirects=False)
    assert done.headers["location"] == "/done"
    assert "You have already completed this survey" in app_client.get(f"/surveys/{survey}").text  # a sentence
    frozen_clock.advance(dt.timedelta(days=2))
    late = assign_survey(engine, code.group(1), "goal-progress", closes_at=frozen_clock.now() - dt.timedelta(hours=1))
    assert "closed" in app_client.get(f"/surveys/{late}").text
    forged = app_client.get("/s/not-a-real-link")
    assert forged.status_code == 404
    assert "not valid" in forged.text


# Pushback that fits the situation, as the chat page and /help show it (issue 13).


def chatting(engine: Engine, client: TestClient, slug: str, timezone: str = "Europe/Berlin") -> str:
    """A participant of the wellbeing arm signed in with the session cookie; returns their code."""
    [invite] = make_invites(engine, slug)
    who = enroll_fully(client, invite, timezone=timezone)
    put_in_arm(engine, who.code, "wellbeing")
    client.cookies.set(SESSION_COOKIE, who.token)
    return who.code


def open_chat(client: TestClient, role: str) -> str:
    started = client.post("/chat", data={"csrf": csrf_of(client.get("/chat").text), "role": role},
                          follow_redirects=False)
    assert started.status_code == 303, started.text
    return str(started.headers["location"])


def send(client: TestClient, chat: str, text: str) -> str:
    page = client.get(chat)
    sent = client.post(f"{chat}/send", data={"csrf": csrf_of(page.text), "content": text})
    assert sent.status_code == 200, sent.text
    return sent.text


def cards(html: str) -> list[str]:
    return re.findall(r'<section class="(?:pushback|check-in|crisis)[^"]*".*?</section>', html, re.DOTALL)


def test_go_ahead_and_reconsider_have_equal_weight_and_only_the_latest_card_has_them(
    engine: Engine, app_client: TestClient, slug: str,
) -> None:
    chatting(engine, app_client, slug)
    chat = open_chat(app_client, "coach")
    send(app_client, chat, FRAMING)
    html = send(app_client, chat, "He obviously hates me, so I'll avoid him")
    old, latest = cards(html)
    assert "Go ahead anyway" not in old
    assert "A newer note replaced this one." in old
    buttons = re.findall(r"<button[^>]*>[^<]*</button>", latest)
    assert [re.sub(r">[^<]*<", "><", b) for b in buttons] == ['<button type="submit" class="choice"></button>'] * 2
    assert [re.sub(r"<[^>]+>", "", b) for b in buttons] == ["Go ahead anyway", "Let me reconsider"]
    css = (Path(api.__file__).parent / "static" / "app.css").read_text(encoding="utf-8")
    assert "button.choice { background: #fff; color: var(--accent); }" in css  # neither is the filled default
    rules = re.sub(r"/\*.*?\*/", "", css, flags=re.DOTALL)
    assert not re.search(r"(?:override|reconsider|choice:)[^{]*\{", rules)  # and no rule singles one out


def test_distress_and_harm_cards_have_no_override_buttons_and_resources_are_links(
    engine: Engine, app_client: TestClient, slug: str,
) -> None:
    chatting(engine, app_client, slug, timezone="America/New_York")
    chat = open_chat(app_client, "concierge")
    html = send(app_client, chat, "I feel hopeless, like I'm falling apart")
    [check_in] = cards(html)
    assert check_in.startswith('<section class="check-in"')
    assert "Checking in" in check_in
    assert '<a href="tel:988">988</a>' in check_in  # a gentle offer of the study's line, one tap away
    assert "<button" not in check_in
    html = send(app_client, chat, "Help me ruin her reputation at work so she gets fired")
    declined = cards(html)[-1]
    assert "I won't help with this part" in declined
    assert "<button" not in declined
    assert "On it." not in html
    html = send(app_client, chat, "Help me get back at my coworker by spreading rumours about him")
    escalated = cards(html)[-1]
    assert escalated.startswith('<section class="crisis"')
    assert '<a href="tel:911">911</a>' in escalated
    assert "988" not in escalated  # not the suicide line for a threat to someone else
    assert "<button" not in escalated


def test_help_keeps_regional_resources_after_withdrawal_with_phone_numbers_and_sites_as_links(
    engine: Engine, app_client: TestClient, slug: str,
) -> None:
    chatting(engine, app_client, slug, timezone="Europe/Berlin")
    before = app_client.get("/help").text
    me = app_client.get("/me")
    withdrawn = app_client.post("/me/withdraw", data={"csrf": csrf_of(me.text), "confirm": "yes",
                                                      "level": "stop_contact"})
    assert "You have withdrawn" in withdrawn.text
    after = app_client.get("/help")
    assert after.status_code == 200
    nav = re.compile(r"<nav .*?</nav>", re.S)  # the navigation now offers My study alone
    assert nav.sub("", after.text) == nav.sub("", before)
    for link in ('<a href="tel:08001110111">0800 111 0 111</a>', '<a href="tel:08001110222">0800 111 0 222</a>',
                 '<a href="tel:112">112</a>',  # the protocol's DE entry
                 '<a href="https://findahelpline.com">https://findahelpline.com</a>',  # and the default
                 '<a href="tel:116016">116 016</a>', '<a href="https://www.hilfetelefon.de">'):  # danger from others
        assert link in after.text, link
    app_client.cookies.clear()
    anonymous = app_client.get("/help").text
    assert '<a href="https://findahelpline.com">https://findahelpline.com</a>' in anonymous


@pytest.mark.parametrize(("text", "html"), [
    ("Call or text **988**, or text HOME to 741741. In an emergency call 911.",
     '<p>Call or text <strong><a href="tel:988">988</a></strong>, or text HOME to <a href="sms:741741">741741</a>. '
     'In an emergency call <a href="tel:911">911</a>.</p>\n'),
    ("Samaritans 116 123 (free, 24/7), 1-800-799-7233, see https://example.org/help.",
     '<p>Samaritans <a href="tel:116123">116 123</a> (free, 24/7), <a href="tel:18007997233">1-800-799-7233</a>, '
     'see <a href="https://example.org/help">https://example.org/help</a>.</p>\n'),
    ("Open 09:00-17:00 since 2024, 3.5 km away, on 2026-03-05; [call us](tel:123) or www.example.org",
     '<p>Open 09:00-17:00 since 2024, 3.5 km away, on 2026-03-05; <a href="tel:123">call us</a> or '
     '<a href="https://www.example.org">www.example.org</a></p>\n'),
])
def test_resource_texts_link_phone_numbers_and_web_addresses_only(text: str, html: str) -> None:
    assert resources_html(text) == html


def test_chat_marks_the_role_change_and_my_study_names_instruments_and_each_decision_once(
        engine: Engine, app_client: TestClient, slug: str, frozen_clock: FrozenClock) -> None:
    chatting(engine, app_client, slug)  # enrolled 2026-03-02 10:00 in Berlin
    chat = open_chat(app_client, "coach")
    send(app_client, chat, "Should I take the job in Lisbon?")
    switched = app_client.post(f"{chat}/role", data={"csrf": csrf_of(app_client.get(chat).text),
                                                     "role": "collaborator"})
    assert switched.status_code == 200, switched.text
    html = send(app_client, chat, "What would I be giving up?")
    entries = re.findall(r'<li class="(msg \w+|role-change)"', html)
    assert entries == ["msg participant", "msg assistant", "role-change", "msg participant", "msg assistant"]
    assert '<li class="role-change"><span>You switched the assistant from Coach to Collaborator</span></li>' in html

    ended = app_client.post(f"{chat}/end", data={"csrf": csrf_of(app_client.get(f"{chat}/end").text), "rating": "5",
                                                 "made_decision": "yes", "decision": "Take the job in Lisbon"})
    assert ended.status_code == 200, ended.text
    coming = re.search(r'<h2 id="upcoming">Coming up</h2>\s*<ul class="list">(.*?)</ul>', app_client.get("/me").text,
                       re.DOTALL)
    assert coming
    assert re.findall(r"<li>(.*?)</li>", coming.group(1)) == [
        "Decision Regret Scale about your decision “Take the job in Lisbon”: around 5 March, then around 16 March",
        "PERMA-Profiler: around 9 March, then around 30 March"]


def test_answer_scales_are_a_grid_of_numbers_or_one_worded_option_per_line(
        engine: Engine, app_client: TestClient, slug: str) -> None:
    code = chatting(engine, app_client, slug)
    perma = app_client.get("/surveys").text
    baseline = re.search(r'href="(/surveys/\d+)"', perma)
    assert baseline
    page = app_client.get(baseline.group(1)).text
    assert page.count('<div class="scale numbers two-rows cols-6">') == 5  # 0-10: rows of 6 and 5 on a phone
    regret = app_client.get(f"/surveys/{assign_survey(engine, code, 'decision-regret', context={'decision': 'X'})}")
    assert regret.text.count('<div class="scale options">') == 5  # every point worded: one per line
    assert "scale-legend" not in regret.text
    rating = app_client.get(f"/surveys/{assign_survey(engine, code, 'immediate-rating')}").text
    assert '<div class="scale numbers">' in rating  # 1-7 in one row, its three words in the legend
    assert '<span class="point-label visually-hidden"> Somewhat helpful</span>' in rating
    assert re.search(r'<p class="scale-legend" aria-hidden="true"><span>1 = Not at all helpful</span>'
                     r'<span>4 = Somewhat helpful</span><span>7 = Extremely helpful</span></p>', rating)


def test_coming_back_shows_the_reply_still_being_written_or_offers_to_try_again(
    engine: Engine, app_client: TestClient, slug: str,
) -> None:
    code = chatting(engine, app_client, slug)
    chat = open_chat(app_client, "coach")
    conversation_id = int(chat.rsplit("/", 1)[1])
    with session_scope(engine) as session:  # sent, and the tab closed while the reply is being written
        participant = session.scalars(sa.select(Participant).where(Participant.code == code)).one()
        chat_service.accept_message(session, participant, conversation_id, "Should I sell the car?")
    writing = app_client.get(chat).text
    assert "The assistant is still writing its reply" in writing
    assert f'data-awaiting-reply="/api/v1/me/conversations/{conversation_id}"' in writing
    assert "Try again" not in writing
    assert app_client.get(f"/api/v1/me/conversations/{conversation_id}").json()["awaiting_reply"] is True

    # The process writing it died: the message is left unanswered, and the page says so.
    with subprocess.Popen(["sleep", "30"]) as child:
        dead = processes.owner_of(child.pid)
        child.kill()
    with engine.begin() as connection:
        connection.execute(sa.update(Conversation).values(reply_claimed_by=dead))
    unanswered = app_client.get(chat).text
    assert "still writing" not in unanswered
    assert "The assistant could not answer your last message. Your message is saved; try again." in unanswered
    assert f'action="/chat/{conversation_id}/retry"' in unanswered
    assert app_client.get(f"/api/v1/me/conversations/{conversation_id}").json()["awaiting_reply"] is False
    answered = app_client.post(f"{chat}/retry", data={"csrf": csrf_of(unanswered)})
    assert answered.status_code == 200, answered.text
    assert answered.text.count('class="msg assistant"') == 1
    assert "Try again" not in answered.text
    assert "could not answer" not in answered.text


def navigation(html: str) -> list[str]:
    nav = re.search(r'<nav aria-label="Main">(.*?)</nav>', html, re.S)
    assert nav, html
    return re.findall(r'<a (?:class="[^"]*" )?href="([^"]+)"', nav.group(1))


def test_the_navigation_offers_the_app_only_once_enrolled(engine: Engine, app_client: TestClient,
                                                          example_protocol: str) -> None:
    """Chat, Surveys and My study appear once consent is signed and the profile complete; before
    that only help; after withdrawal, My study alone (where the withdrawal is shown)."""
    [invite] = make_invites(engine, load_study(engine, example_protocol))
    assert navigation(app_client.get("/").text) == ["/help"]
    consent_page = join(app_client, invite)
    assert navigation(consent_page) == ["/help"]
    assert navigation(app_client.get("/help").text) == ["/help"]
    sign(app_client, consent_page)
    onboarding = app_client.get("/onboarding")
    assert navigation(onboarding.text) == ["/help"]
    enrolled = app_client.post("/onboarding", data={"csrf": csrf_of(onboarding.text), "timezone": "Europe/Paris",
                                                    "contact_email": ""})
    assert enrolled.status_code == 200, enrolled.text
    for path in ("/", "/chat", "/surveys", "/me", "/help"):
        assert navigation(app_client.get(path).text) == ["/chat", "/surveys", "/me", "/help"], path
    me = app_client.get("/me").text
    withdrawn = app_client.post("/me/withdraw", data={"csrf": csrf_of(me), "confirm": "yes",
                                                      "level": "stop_contact"})
    assert withdrawn.status_code == 200, withdrawn.text
    assert navigation(withdrawn.text) == ["/me", "/help"]
    assert navigation(app_client.get("/me").text) == ["/me", "/help"]


def test_the_example_consent_asks_for_initials_and_says_where_they_are_kept(
        engine: Engine, app_client: TestClient, example_protocol: str) -> None:
    """The example says it does not ask for a name, so the signature is initials, and the page says
    where they are kept (the consents export holds no signature: tests/analysis/test_exports.py compares
    it column by column with the database)."""
    [invite] = make_invites(engine, load_study(engine, example_protocol))
    text = " ".join(html.unescape(join(app_client, invite)).split())
    assert "We do not ask for your name: you sign this form with your initials" in text
    assert "Type your initials to sign" in text
    assert "name or initials" not in text
    assert "Your initials are kept with this consent record" in text
    assert 'autocomplete="name"' not in text
