"""The orchestration runtime: create a run, resolve its modes, execute its tasks, record it all.

One run holds one or more tasks. Each task runs on a worker backend: ``inline`` (a registered
Python callable; never calls a model, so never has reasoning) or ``provider`` (the agent loop).
The disclosure mode is resolved once per run (explicit > run > config > ``hidden``), stored on the
run and announced in ``capability.resolved``; every later decision reads it from there.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from thoughtgate.config import (
    Config,
    ProviderEndpoint,
    resolve_chain_of_thought,
    resolve_worker_backend,
)
from thoughtgate.disclosure import Disclosure
from thoughtgate.engine.approvals import ApprovalBroker
from thoughtgate.engine.history import conversation_from_events
from thoughtgate.engine.loop import LoopObserver, LoopResult, run_agent_loop
from thoughtgate.engine.tools import ToolRegistry
from thoughtgate.errors import ThoughtgateError, UsageError
from thoughtgate.events.catalogue import check_new_events
from thoughtgate.events.payloads import (
    CapabilityResolvedPayload,
    MessageCompletedPayload,
    MessagePartiallyCompletedPayload,
    RunEndedPayload,
    RunStartedPayload,
    RunStatus,
    SettingSource,
    TaskCompletedPayload,
    TaskStartedPayload,
    WorkerCompletedPayload,
    token_usage,
)
from thoughtgate.events.schema import EventType, NewEvent
from thoughtgate.orchestration.recorder import EventRecorder, EventSink
from thoughtgate.providers.base import Provider, ProviderSettings, create_provider, split_model
from thoughtgate.store.base import EventStore
from thoughtgate.store.records import RunRecord, TaskRecord, new_id
from thoughtgate.types import Message, Usage

__all__ = [
    "InlineWorker",
    "ObserverFactory",
    "ProviderFactory",
    "RunRequest",
    "Runtime",
    "TaskSpec",
    "provider_settings_from_config",
]

InlineWorker = Callable[[str], str | Awaitable[str]]
ProviderFactory = Callable[[str], Provider]
ObserverFactory = Callable[[RunRecord, Disclosure], LoopObserver | None]

_CONFIG_SECTION = {
    "anthropic": "anthropic",
    "openai": "openai",
    "openrouter": "openrouter",
    "openai-compatible": "openai_compatible",
}


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """One task of a run; unset fields fall back to the run's."""

    prompt: str
    _: KW_ONLY
    model: str | None = None
    worker: str | None = None
    """Name of a registered inline worker (inline backend)."""
    system: str | None = None
    history: Sequence[Message] = ()
    """Earlier conversation (no reasoning: see ``conversation_from_events``)."""


@dataclass(frozen=True, slots=True)
class RunRequest:
    """What a caller asks for. ``chain_of_thought`` here is the run's own setting."""

    prompt: str
    _: KW_ONLY
    model: str | None = None
    chain_of_thought: str | None = None
    worker_backend: str | None = None
    tasks: Sequence[TaskSpec] = ()
    system: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    history: Sequence[Message] = ()


def provider_settings_from_config(
    config: Config, model: str, *, base_url: str | None = None, api_key: str | None = None
) -> ProviderSettings:
    """CLI flag > config section > (the adapter's own env/default lookup)."""
    prefix, _ = split_model(model)
    section = _CONFIG_SECTION.get(prefix)
    endpoint: ProviderEndpoint = (
        getattr(config.providers, section) if section else ProviderEndpoint()
    )
    options = endpoint.adapter_options()
    return ProviderSettings(
        base_url=base_url or endpoint.base_url,
        api_key=api_key or endpoint.api_key,
        timeout_s=endpoint.timeout_s,
        connect_timeout_s=endpoint.connect_timeout_s,
        max_retries=endpoint.max_retries,
        extra={"thoughtgate": options} if options else {},
    )


class Runtime:
    """Creates and executes runs against one store."""

    def __init__(
        self,
        store: EventStore,
        config: Config | None = None,
        *,
        provider_factory: ProviderFactory | None = None,
        inline_workers: Mapping[str, InlineWorker] | None = None,
        tools: ToolRegistry | None = None,
        approvals: ApprovalBroker | None = None,
        observer_factory: ObserverFactory | None = None,
        sinks: Sequence[EventSink] = (),
    ) -> None:
        self.store = store
        self.config = config or Config()
        self.provider_factory = provider_factory or self._default_provider
        self.inline_workers = dict(inline_workers or {})
        self.tools = tools or ToolRegistry()
        self.approvals = approvals or ApprovalBroker()
        self.observer_factory = observer_factory
        self._specs: dict[str, list[TaskSpec]] = {}
        self.sinks: list[EventSink] = list(sinks)

    async def _append(self, run_id: str, events: list[NewEvent]) -> None:
        """Every append outside a task recorder goes through here so sinks see it."""
        check_new_events(events)
        out = await self.store.append(run_id, events)
        for sink in self.sinks:
            await sink(out)

    def _default_provider(self, model: str) -> Provider:
        return create_provider(model, provider_settings_from_config(self.config, model))

    # ------------------------------------------------------------------ create
    async def create_run(
        self,
        request: RunRequest,
        *,
        chain_of_thought: str | None = None,
        worker_backend: str | None = None,
    ) -> RunRecord:
        """Validate, resolve modes, store the run with its tasks, record the opening events."""
        orch = self.config.orchestration
        mode = resolve_chain_of_thought(
            chain_of_thought, request.chain_of_thought, orch.chain_of_thought
        )
        backend = resolve_worker_backend(
            worker_backend, request.worker_backend, orch.worker_backend
        )
        model = request.model or orch.default_model
        specs = list(request.tasks) or [
            TaskSpec(request.prompt, system=request.system, history=request.history)
        ]
        self._validate(backend, model, specs)
        run = RunRecord(
            new_id("run"),
            request.prompt,
            model=model,
            chain_of_thought=mode,
            worker_backend=backend,
            metadata=dict(request.metadata),
        )
        run.tasks = [
            TaskRecord(
                new_id("task"),
                run.run_id,
                i,
                spec.prompt,
                model=spec.model or model if backend == "provider" else None,
                backend=backend,
            )
            for i, spec in enumerate(specs)
        ]
        await self.store.create_run(run)
        started: RunStartedPayload = {"prompt": request.prompt, "model": model, "tasks": len(specs)}
        resolved: CapabilityResolvedPayload = {
            "chain_of_thought": mode,
            "worker_backend": backend,
            "reasoning_requested": Disclosure.of(mode).requests_reasoning,
            "sources": {
                "chain_of_thought": _source(
                    chain_of_thought, request.chain_of_thought, orch.chain_of_thought
                ),
                "worker_backend": _source(
                    worker_backend, request.worker_backend, orch.worker_backend
                ),
            },
            "model": model,
        }
        await self._append(
            run.run_id,
            [
                NewEvent(EventType.RUN_STARTED, started),
                NewEvent(EventType.CAPABILITY_RESOLVED, resolved),
            ],
        )
        self._specs[run.run_id] = specs
        return run

    def _validate(self, backend: str, model: str | None, specs: Sequence[TaskSpec]) -> None:
        if backend == "provider":
            for spec in specs:
                chosen = spec.model or model
                if not chosen:
                    raise UsageError("a provider run needs --model PROVIDER:MODEL")
                split_model(chosen)
        else:
            for spec in specs:
                name = spec.worker or "default"
                if name not in self.inline_workers:
                    known = ", ".join(sorted(self.inline_workers)) or "none registered"
                    raise UsageError(f"no inline worker named {name!r}; known: {known}")

    # ------------------------------------------------------------------ execute
    async def execute(self, run_id: str) -> RunRecord:
        """Run every task in order; the run always ends with exactly one terminal event."""
        run = await self.store.get_run(run_id)
        specs = self._specs.pop(run_id, None) or [
            TaskSpec(t.prompt, model=t.model) for t in run.tasks
        ]
        disclosure = Disclosure.of(run.chain_of_thought)
        await self.store.update_run(run_id, status="running")
        total = Usage()
        statuses: list[str] = []
        status: RunStatus
        try:
            for task, spec in zip(run.tasks, specs, strict=True):
                usage, task_status = await self._execute_task(run, task, spec, disclosure)
                total = total + usage
                statuses.append(task_status)
        except ThoughtgateError as exc:
            await self._finish(run_id, EventType.RUN_FAILED, "failed", total, _describe(exc))
            raise
        except Exception as exc:
            await self._finish(run_id, EventType.RUN_ERROR, "error", total, _describe(exc))
            raise
        status = "completed" if all(s == "completed" for s in statuses) else "partial"
        await self._finish(run_id, EventType.RUN_SETTLEMENT_COMPLETED, status, total, None)
        return await self.store.get_run(run_id)

    async def continue_run(
        self,
        previous_run_id: str,
        prompt: str,
        *,
        model: str | None = None,
        chain_of_thought: str | None = None,
    ) -> RunRecord:
        """A new run that continues an earlier one's conversation, carrying no reasoning.

        The model and the disclosure mode carry over from the earlier run (its mode becomes the
        new run's own setting, so an explicit ``chain_of_thought`` still wins): continuing a
        conversation does not silently change who may see its reasoning.
        """
        previous = await self.store.get_run(previous_run_id)
        history = conversation_from_events(await self.store.read(previous_run_id))
        request = RunRequest(
            prompt,
            model=model or previous.model,
            chain_of_thought=previous.chain_of_thought,
            history=history,
            metadata={"continues": previous_run_id},
        )
        return await self.run(request, chain_of_thought=chain_of_thought)

    async def run(
        self,
        request: RunRequest,
        *,
        chain_of_thought: str | None = None,
        worker_backend: str | None = None,
    ) -> RunRecord:
        run = await self.create_run(
            request, chain_of_thought=chain_of_thought, worker_backend=worker_backend
        )
        return await self.execute(run.run_id)

    async def _finish(
        self, run_id: str, event_type: str, status: RunStatus, usage: Usage, error: str | None
    ) -> None:
        payload: RunEndedPayload = {"status": status, "usage": token_usage(usage)}
        if error:
            payload["error"] = error
        await self._append(run_id, [NewEvent(event_type, payload)])
        await self.store.update_run(
            run_id,
            status=status,
            usage=usage.to_dict(),
            error=error,
        )

    async def _execute_task(
        self, run: RunRecord, task: TaskRecord, spec: TaskSpec, disclosure: Disclosure
    ) -> tuple[Usage, str]:
        recorder = EventRecorder(self.store, run.run_id, sinks=self.sinks)
        started = time.monotonic()
        task.status = "running"
        await self.store.save_task(task)
        opened: TaskStartedPayload = {
            "index": task.index,
            "prompt": task.prompt,
            "backend": task.backend,
            "model": task.model,
        }
        await recorder.emit(NewEvent(EventType.TASK_STARTED, opened, task_id=task.task_id))
        try:
            try:
                if run.worker_backend == "inline":
                    result = await self._inline(spec, task, recorder)
                else:
                    result = await self._provider(run, spec, task, recorder, disclosure)
            finally:
                await recorder.close()
        except Exception as exc:
            await self._task_aborted(run, task, _describe(exc))
            raise
        task.status = result.status
        task.output = result.answer
        task.usage = result.usage.to_dict()
        task.error = result.error
        task.reasoning = result.reasoning if disclosure.on_display and result.reasoning else None
        await self.store.save_task(task)
        await self._worker_completed(run, task, result, disclosure, time.monotonic() - started)
        return result.usage, result.status

    async def _task_aborted(self, run: RunRecord, task: TaskRecord, error: str) -> None:
        """A task whose worker raised still ends (failed, with the error) before the run's
        terminal event, so no reader waits on a task that will never finish."""
        task.status = "failed"
        task.error = error
        await self.store.save_task(task)
        payload: TaskCompletedPayload = {"status": "failed", "output": None, "error": error}
        await self._append(
            run.run_id, [NewEvent(EventType.TASK_COMPLETED, payload, task_id=task.task_id)]
        )

    async def _worker_completed(
        self,
        run: RunRecord,
        task: TaskRecord,
        result: LoopResult,
        disclosure: Disclosure,
        duration: float,
    ) -> None:
        payload: WorkerCompletedPayload = {
            "mode": disclosure.mode,
            "backend": run.worker_backend,
            "model": task.model,
            "status": result.status,
            "usage": token_usage(result.usage),
            "turns": result.turns,
            "duration_s": round(duration, 6),
            "finish_reason": result.finish_reason,
        }
        if disclosure.in_trace:
            text = result.reasoning
            payload["trace"] = {
                "reasoning": text,
                "reasoning_chars": len(text),
                "reasoning_bytes": len(text.encode("utf-8")),
                "continuity": [
                    {"carrier": b.carrier, "provider": b.provider, "model": b.model}
                    for t in result.turn_records
                    for b in t.continuity
                ],
            }
        done: TaskCompletedPayload = {
            "status": result.status,
            "output": result.answer,
            "error": result.error,
        }
        await self._append(
            run.run_id,
            [
                NewEvent(EventType.WORKER_COMPLETED, payload, task_id=task.task_id),
                NewEvent(EventType.TASK_COMPLETED, done, task_id=task.task_id),
            ],
        )

    async def _inline(
        self, spec: TaskSpec, task: TaskRecord, recorder: EventRecorder
    ) -> LoopResult:
        worker = self.inline_workers[spec.worker or "default"]
        try:
            value = worker(task.prompt)
            output = await value if inspect.isawaitable(value) else value
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            cut: MessagePartiallyCompletedPayload = {
                "text": "",
                "reason": "worker_error",
                "error": error,
            }
            await recorder.emit(
                NewEvent(EventType.MESSAGE_PARTIALLY_COMPLETED, cut, task_id=task.task_id)
            )
            return LoopResult("failed", "", 0, Usage(), "", "error", error)
        text = str(output)
        final: MessageCompletedPayload = {"text": text}
        await recorder.emit(NewEvent(EventType.MESSAGE_COMPLETED, final, task_id=task.task_id))
        return LoopResult("completed", text, 0, Usage(), "", "stop")

    def _visible_reasoning(
        self, run: RunRecord, spec: TaskSpec, disclosure: Disclosure
    ) -> LoopObserver | None:
        """The default observer: policy-checked ``cot.*`` steps for eligible runs."""
        from thoughtgate.events.pipeline import observer_factory

        summarizer = None
        vr = self.config.visible_reasoning
        if "model" in vr.summarizers and vr.summarizer_model:
            summarizer = self.provider_factory(vr.summarizer_model)
        make = observer_factory(
            self.config, summarizer_provider=summarizer, hidden_texts=lambda _: _hidden_texts(spec)
        )
        return make(run, disclosure)

    async def _provider(
        self,
        run: RunRecord,
        spec: TaskSpec,
        task: TaskRecord,
        recorder: EventRecorder,
        disclosure: Disclosure,
    ) -> LoopResult:
        model = task.model or run.model
        assert model is not None
        provider = self.provider_factory(model)
        if self.observer_factory is not None:
            observer = self.observer_factory(run, disclosure)
        else:
            observer = self._visible_reasoning(run, spec, disclosure)
        try:
            return await run_agent_loop(
                provider,
                [*spec.history, Message.user(task.prompt)],
                recorder=recorder,
                task_id=task.task_id,
                disclosure=disclosure,
                tools=self.tools,
                approvals=self.approvals,
                max_turns=self.config.orchestration.max_turns,
                approval_timeout=self.config.orchestration.approval_timeout_s,
                system=spec.system,
                observer=observer,
            )
        finally:
            await provider.aclose()


def _describe(exc: Exception) -> str:
    """Our own errors speak for themselves; anything else is named by its type."""
    return str(exc) if isinstance(exc, ThoughtgateError) else f"{type(exc).__name__}: {exc}"


def _hidden_texts(spec: TaskSpec) -> list[str]:
    """What no visible step may quote: the system prompt and earlier turns' instructions."""
    return [spec.system] if spec.system else []


def _source(explicit: str | None, run: str | None, config: str | None) -> SettingSource:
    if explicit is not None:
        return "explicit"
    if run is not None:
        return "run"
    if config is not None:
        return "config"
    return "default"
