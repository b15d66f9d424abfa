"""Producing a reply on a task of its own, so that it is stored whether or not anyone still waits.

A turn's answer (``chat.turn.answer``: the LLM reader, the model call and the storing of its
outcome) runs on a task the process owns, not on the request that asked for it: a closed tab, a dropped connection
or a cancelled request leaves it running, and it always ends, within its time limit, by storing
the reply or the failure (the message kept for a retry, or the platform's safety reply). The
request only waits for it, or streams its text as it comes.

While a reply is being written, its claim on the conversation is renewed every few seconds, so
no sibling process takes it over. A process that stops releases the claims it leaves unfinished;
one that dies without doing so is found gone by the next request that meets its claim, or by the
next API process when it starts (``chat.service.take_over_abandoned``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from functools import partial

from chat import service, turn
from chat.gateway import Gateway
from chat.turn import Outcome, Units

log = logging.getLogger("afterward.chat.replies")
RENEW_EVERY = 5.0  # seconds between renewals of the claims in flight; well within service.REPLY_LEASE
STOP_WAIT = 1.0  # seconds a stopping process gives its cancelled replies to finish storing


class Reply:
    """A reply in flight: its text as the model writes it (when streamed), then its outcome."""

    def __init__(self, task: asyncio.Task[Outcome], pieces: asyncio.Queue[str | None]) -> None:
        self._task, self._pieces = task, pieces

    async def pieces(self) -> AsyncIterator[str]:
        while (piece := await self._pieces.get()) is not None:
            yield piece

    async def outcome(self) -> Outcome:
        """Wait for the stored outcome; cancelling the wait leaves the reply running."""
        return await asyncio.shield(self._task)


class Replies:
    """This process's replies in flight."""

    def __init__(self, run: Units) -> None:
        self._run = run
        self._store = turn.DatabaseStore(run)
        self._in_flight: dict[asyncio.Task[Outcome], int] = {}  # -> conversation id
        self._renewer: asyncio.Task[None] | None = None

    def start(self, gateway: Gateway, prepared: service.PreparedTurn, *, streamed: bool = False) -> Reply:
        """Start producing the reply to a prepared turn (one not answered yet)."""
        assert prepared.existing_reply_id is None, "a resent message that was answered needs no reply"
        pieces: asyncio.Queue[str | None] = asyncio.Queue()
        task = asyncio.get_running_loop().create_task(self._produce(gateway, prepared, pieces if streamed else None))
        self._in_flight[task] = prepared.conversation_id
        task.add_done_callback(self._done)
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.get_running_loop().create_task(self._renew())
        return Reply(task, pieces)

    async def complete(self, gateway: Gateway, prepared: service.PreparedTurn) -> Outcome:
        return await self.start(gateway, prepared).outcome()

    async def take_over_abandoned(self) -> int:
        """Release every claim nobody will finish (at start-up: those of a process that died)."""
        released = 0
        for conversation_id in await self._run(service.abandoned_claims):
            try:
                released += await self._run(partial(service.take_over_abandoned, conversation_id=conversation_id))
            except Exception:  # one conversation's trouble does not keep the others waiting
                log.exception("could not release the abandoned reply claim of conversation %s", conversation_id)
        if released:
            log.warning("released %d reply claim(s) left by a process that stopped", released)
        return released

    async def stop(self) -> None:
        """Cancel the replies still in flight and release their claims (each message marked
        failed, or given the platform's safety reply), so none waits for this process."""
        if self._renewer is not None:
            self._renewer.cancel()
            self._renewer = None
        tasks = dict(self._in_flight)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=STOP_WAIT)
            await self._run(lambda s: service.release_own_claims(s, set(tasks.values())))

    def _done(self, task: asyncio.Task[Outcome]) -> None:
        self._in_flight.pop(task, None)
        if not task.cancelled() and task.exception() is not None:  # also seen when nobody waits any more
            log.error("a reply could not be stored", exc_info=task.exception())
        if not self._in_flight and self._renewer is not None:
            self._renewer.cancel()
            self._renewer = None

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(RENEW_EVERY)
            conversations = set(self._in_flight.values())
            try:
                await self._run(partial(service.renew_claims, conversation_ids=conversations))
            except Exception:  # the next renewal may succeed; the lease leaves time for it
                log.warning("could not renew the claims of %d replies in flight", len(conversations), exc_info=True)

    async def _produce(self, gateway: Gateway, prepared: service.PreparedTurn,
                       pieces: asyncio.Queue[str | None] | None) -> Outcome:
        return await turn.answer(self._store, gateway, prepared, pieces=pieces)
