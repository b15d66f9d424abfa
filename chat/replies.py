"""Producing a reply on a task of its own, so that it is stored whether or not anyone still waits.

A turn's model call and the storing of its outcome (``chat.service``, steps 2 and 3) run on a
task the process owns, not on the request that asked for it: a closed tab, a dropped connection
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
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Protocol, TypeVar

from sqlalchemy.orm import Session

from chat import service
from chat.answer_format import StreamSplitter
from chat.gateway import Completion, Gateway, GatewayError

log = logging.getLogger("afterward.chat.replies")
T = TypeVar("T")
RENEW_EVERY = 5.0  # seconds between renewals of the claims in flight; well within service.REPLY_LEASE
STOP_WAIT = 1.0  # seconds a stopping process gives its cancelled replies to finish storing


class RunsUnits(Protocol):
    """Runs ``work`` in its own committed transaction on a worker thread (``api.deps.run_unit``)."""

    def __call__(self, work: Callable[[Session], T], /) -> Awaitable[T]: ...


@dataclass(frozen=True)
class Outcome:
    prepared: service.PreparedTurn  # as the crisis classifier left it
    reply_id: int | None  # the stored assistant turn; None: the model did not answer, the message is marked failed
    error: GatewayError | None = None


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

    def __init__(self, run: RunsUnits) -> None:
        self._run = run
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
        # The classifier's call, the reply's call, and as long again for a stream's chunks.
        limit = gateway.call_limit * (3 if gateway.classifier_model else 2)
        completion = Completion(streamed=pieces is not None)
        error: GatewayError | None = None
        try:
            async with asyncio.timeout(limit):
                prepared = await self._screened(gateway, prepared)
                if pieces is None:
                    completion = await gateway.complete(prepared.messages, prepared.model)
                else:
                    await self._stream(gateway, prepared, completion, pieces)
        except GatewayError as exc:
            error = exc
        except TimeoutError:
            error = GatewayError("timeout", f"no reply within {limit:g} s")
        finally:
            if pieces is not None:
                pieces.put_nowait(None)
        screened = prepared
        if error is None:
            return Outcome(screened, await self._run(lambda s: service.record_reply(s, screened, completion).id))
        failure = f"{error.kind}: {error}"

        def fail(session: Session) -> int | None:
            reply = service.record_failure(session, screened, failure)
            return reply.id if reply is not None else None
        return Outcome(screened, await self._run(fail), error)

    async def _screened(self, gateway: Gateway, prepared: service.PreparedTurn) -> service.PreparedTurn:
        """Run the optional LLM crisis classifier (after the message is stored, before the reply)."""
        if not gateway.classifier_model or prepared.required.stance == "escalate":
            return prepared
        verdict = await gateway.classify_crisis(prepared.content)
        return await self._run(lambda s: service.reassess(s, prepared, verdict))

    @staticmethod
    async def _stream(gateway: Gateway, prepared: service.PreparedTurn, sink: Completion,
                      pieces: asyncio.Queue[str | None]) -> None:
        """The reply text as it comes, without the stance line. When the platform already requires
        a safety stance nothing is passed on: a reply written as if helping is replaced
        (``chat.policy.shown_reply``), so it must not be shown as it comes."""
        live = prepared.required.stance in ("agree", "nudge", "challenge")
        splitter = StreamSplitter()
        async for text in gateway.stream(prepared.messages, prepared.model, sink):
            shown = splitter.feed(text)
            if shown and live:
                pieces.put_nowait(shown)
        rest = splitter.flush()
        if rest and live:
            pieces.put_nowait(rest)
