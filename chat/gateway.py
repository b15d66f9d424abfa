"""The LLM gateway: the only way the platform reaches a model.

A LiteLLM ``Router`` built from settings gives every model the same timeout, retries and
fallback; the offline provider is registered as a LiteLLM custom provider, so a real provider
(``openai/gpt-4o-mini``, ``anthropic/claude-...``, ``ollama/llama3`` with ``llm_api_base``) is a
settings change. ``complete`` returns the whole answer, ``stream`` yields text as it arrives;
both report tokens, latency and cost.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, cast

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # never fetch the cost map at import

import litellm  # noqa: E402
from litellm import Router  # noqa: E402

from chat import llm_reader  # noqa: E402
from chat.answer_format import STANCE_SCHEMA  # noqa: E402
from chat.llm_reader import LLMReading  # noqa: E402
from chat.offline import PROVIDER, WARM_UP, OfflineLLM  # noqa: E402
from study.settings import Settings  # noqa: E402

log = logging.getLogger("afterward.chat.gateway")
litellm.telemetry = False
litellm.suppress_debug_info = True


class GatewayError(Exception):
    """The model could not answer: ``kind`` is ``timeout`` or ``error``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass
class Completion:
    text: str = ""
    model: str = ""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost_usd: float | None = None
    latency_ms: float = 0.0
    fallback_used: bool = False
    streamed: bool = False


_offline = OfflineLLM()
_routers: dict[tuple[object, ...], Router] = {}


def _register_offline(delay_seconds: float) -> None:
    _offline.delay_seconds = delay_seconds
    if not any(entry.get("provider") == PROVIDER for entry in litellm.custom_provider_map):
        litellm.custom_provider_map = [*litellm.custom_provider_map,
                                       {"provider": PROVIDER, "custom_handler": _offline}]
        litellm.utils.custom_llm_setup()


def _is_timeout(exc: BaseException) -> bool:
    return isinstance(exc, asyncio.TimeoutError | litellm.Timeout) or "timeout" in type(exc).__name__.lower()


class Gateway:
    def __init__(self, settings: Settings) -> None:
        _register_offline(settings.offline_llm_delay_ms / 1000)
        self.default_model = settings.llm_model
        self.fallback_model = settings.llm_fallback_model
        self.timeout = settings.llm_timeout_seconds
        self.reader_model = settings.llm_reader_model
        names = {settings.llm_model}
        for extra in (settings.llm_fallback_model, settings.llm_reader_model):
            if extra:
                names.add(extra)
        self._api_base = settings.llm_api_base
        key = (tuple(sorted(names)), settings.llm_retries, settings.llm_timeout_seconds,
               settings.llm_fallback_model, settings.llm_api_base)
        if key not in _routers:
            # One Router per configuration for the process: every Router LiteLLM builds adds
            # process-wide work to all later calls (measured: a second Router doubles call cost).
            _routers[key] = Router(
                model_list=[self._deployment(name) for name in sorted(names)],
                num_retries=settings.llm_retries,
                timeout=settings.llm_timeout_seconds,
                fallbacks=([{name: [settings.llm_fallback_model]} for name in sorted(names)
                            if name != settings.llm_fallback_model] if settings.llm_fallback_model else []),
                retry_after=0,
            )
        self.router = _routers[key]
        self._known = {d["model_name"] for d in self.router.registry().all()}

    @property
    def call_limit(self) -> float:
        """The longest one call waits for the model to start answering: every try, and a second."""
        return self.timeout * (1 + self.router.num_retries) + 1

    def _deployment(self, name: str) -> dict[str, Any]:
        params: dict[str, Any] = {"model": name, "timeout": self.timeout}
        if self._api_base and not name.startswith(f"{PROVIDER}/"):
            params["api_base"] = self._api_base
        return {"model_name": name, "litellm_params": params}

    def ensure_model(self, name: str) -> None:
        """Arms may name their own model; add it to the router the first time it is used."""
        if name not in self._known:
            self.router.add_deployment(litellm.types.router.Deployment(**self._deployment(name)))
            self._known.add(name)

    def _structured(self, model: str) -> bool:
        try:
            return bool(litellm.supports_response_schema(model=model))
        except Exception:  # unknown models are simply treated as unstructured
            return False

    async def complete(self, messages: list[dict[str, str]], model: str | None = None,
                       *, structured: bool = True, params: dict[str, Any] | None = None,
                       check: Callable[[Completion], object] | None = None) -> Completion:
        """The whole answer. ``params``: further call settings (``seed``, ``temperature``, a
        ``response_format`` of the caller's own), as the evaluation harness records them.
        ``check``: the caller's test of an answer, raising when it cannot be used (a gateway that
        keeps answers, ``evals.cache``, keeps none that fails it)."""
        model = model or self.default_model
        self.ensure_model(model)
        kwargs: dict[str, Any] = dict(params or {})
        if structured and self._structured(model):
            kwargs["response_format"] = {"type": "json_schema", "json_schema": STANCE_SCHEMA}
        started = time.perf_counter()
        try:
            response = await asyncio.wait_for(
                self.router.acompletion(model=model, messages=cast(Any, messages), **kwargs),
                timeout=self.call_limit)
        except Exception as exc:
            raise self._error(exc, model) from exc
        completion = self._completion(response, model, started)
        if check is not None:
            check(completion)
        return completion

    async def stream(self, messages: list[dict[str, str]], model: str | None = None,
                     sink: Completion | None = None) -> AsyncIterator[str]:
        """Yield text as the model produces it; ``sink`` receives model, usage and latency at the end."""
        model = model or self.default_model
        self.ensure_model(model)
        result = sink if sink is not None else Completion()
        started = time.perf_counter()
        try:
            response = await asyncio.wait_for(
                self.router.acompletion(model=model, messages=cast(Any, messages), stream=True,
                                        stream_options={"include_usage": True}),
                timeout=self.call_limit)
            iterator = cast(Any, response).__aiter__()
            while True:
                try:
                    chunk = await asyncio.wait_for(iterator.__anext__(), timeout=self.timeout)
                except StopAsyncIteration:
                    break
                usage = getattr(chunk, "usage", None)
                if usage is not None:
                    result.prompt_tokens = usage.prompt_tokens
                    result.completion_tokens = usage.completion_tokens
                result.model = getattr(chunk, "model", None) or result.model
                text = chunk.choices[0].delta.content if chunk.choices else None
                if text:
                    result.text += text
                    yield text
        except GatewayError:
            raise
        except Exception as exc:
            raise self._error(exc, model) from exc
        result.latency_ms = (time.perf_counter() - started) * 1000
        result.model = _model_name(result.model, model)
        result.fallback_used = result.model != model
        result.cost_usd = self._cost(result.model, result.prompt_tokens, result.completion_tokens)

    def _completion(self, response: Any, model: str, started: float) -> Completion:
        usage = getattr(response, "usage", None)
        used = _model_name(getattr(response, "model", None), model)
        result = Completion(
            text=response.choices[0].message.content or "",
            model=used,
            prompt_tokens=getattr(usage, "prompt_tokens", None),
            completion_tokens=getattr(usage, "completion_tokens", None),
            latency_ms=(time.perf_counter() - started) * 1000,
            fallback_used=used != model,
        )
        result.cost_usd = self._cost(used, result.prompt_tokens, result.completion_tokens)
        return result

    @staticmethod
    def _cost(model: str, prompt_tokens: int | None, completion_tokens: int | None) -> float | None:
        if model.startswith(f"{PROVIDER}/"):
            return 0.0
        try:
            prompt_cost, completion_cost = litellm.cost_per_token(
                model=model, prompt_tokens=prompt_tokens or 0, completion_tokens=completion_tokens or 0)
            return float(prompt_cost + completion_cost)
        except Exception:  # no price known for this model: record None, not a guess
            return None

    @staticmethod
    async def warm_up() -> None:
        """One call to the offline provider (no network, no cost), so that LiteLLM's set-up on its
        first call (~2 s of imports) happens at start-up, not in a participant's first reply."""
        await litellm.acompletion(model=f"{PROVIDER}/{WARM_UP}", messages=[
            {"role": "system", "content": "Role: concierge"}, {"role": "user", "content": "Hello"}])

    async def read_message(self, text: str) -> LLMReading | None:
        """The optional LLM reader's reading of one participant message (``chat.llm_reader``), or
        None when no reader is configured. It never raises for the reader's sake: a call that failed
        or timed out (within ``call_limit``) or an answer without a complete verdict is a reading
        without a verdict, logged, and the local reading decides alone."""
        model = self.reader_model
        if not model:
            return None
        version = llm_reader.rubric().version
        params = {"response_format": llm_reader.RESPONSE_FORMAT} if self._structured(model) else None
        try:
            completion = await self.complete(llm_reader.request(text), model, structured=False, params=params)
        except GatewayError as exc:  # logged by _error
            return LLMReading(model, version, problem=exc.kind)
        verdict = llm_reader.parse_verdict(completion.text)
        if verdict is None:  # the answer may quote the participant: its length is logged, not its text
            log.warning("LLM reader %s gave no complete verdict (%d characters)", model, len(completion.text))
            return LLMReading(model, version, problem="malformed")
        return LLMReading(model, version, verdict)

    def _error(self, exc: BaseException, model: str) -> GatewayError:
        kind = "timeout" if _is_timeout(exc) else "error"
        log.warning("LLM %s for %s: %s", kind, model, exc)
        return GatewayError(kind, f"{model}: {type(exc).__name__}")


def _model_name(reported: str | None, requested: str) -> str:
    """LiteLLM reports the provider's own name; keep the configured name when it matches."""
    if not reported:
        return requested
    if reported == requested or requested.endswith("/" + reported) or reported.endswith(requested):
        return requested
    return reported
