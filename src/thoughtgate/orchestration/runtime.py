"""The orchestration runtime: create a run, resolve its modes, execute its tasks, record it all.

One run holds one or more tasks. Each task runs on a worker backend: ``inline`` (a registered
Python callable; never calls a model, so never has reasoning) or ``provider`` (the agent loop).
The disclosure mode is resolved once per run (explicit > run > config > ``hidden``), stored on the
run and announced in ``capability.resolved``; every later decision reads it from there.

How a run ends (every run ends with exactly one terminal event, after every task has ended):

==================================================  ===========  =============================
what happened                                       run status   terminal event
==================================================  ===========  =============================
every task answered                                 completed    ``run.settlement.completed``
an answer was cut after some of it arrived          partial      ``run.settlement.completed``
  (or the turn limit stopped a task)
a task got no answer (provider outage, error)       failed       ``run.failed``
a ``ThoughtgateError`` escaped (store, bad setup)   failed       ``run.failed``
any other exception                                 error        ``run.error``
cancelled (Ctrl-C, MCP cancel, shutdown, lease      interrupted  ``run.interrupted``
  lost); tasks get ``task.completed`` interrupted
==================================================  ===========  =============================

A provider is built when the run is created, so a missing key or an unknown model is a
``UsageError`` before any run exists. While it executes, the run's lease is renewed
(``orchestration.leases``); a process that dies leaves a run that others close (ADR 0009) -- or,
when the runtime is durable (``orchestration.durable``, ADR 0013), resume from its last completed
step. The run's whole spec (each task's prompt, model, system prompt, worker and earlier
conversation, and the names of its tools) is stored with it, and any process can execute it
from the store, so no surface depends on the memory of the one that created it (that one, running
the run itself at once, keeps what it stored instead of reading it back: ADR 0021). A run's tools are a parameter of its
execution (``tools_for`` its spec), not a copy of the runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeAlias

from thoughtgate.config import (
    Config,
    ProviderEndpoint,
    resolve_chain_of_thought,
    resolve_worker_backend,
)
from thoughtgate.disclosure import Disclosure, kept_detail
from thoughtgate.engine.approvals import ApprovalBroker, Decision
from thoughtgate.engine.history import conversation_from_events, history_payload
from thoughtgate.engine.loop import (
    LoopObserver,
    LoopResult,
    error_type_of,
    offered_tools,
    run_agent_loop,
)
from thoughtgate.engine.steps import DirectSteps, ResumeLog, StepCodec, Steps
from thoughtgate.engine.tools import ToolRegistry
from thoughtgate.errors import (
    ApprovalNotPendingError,
    ProviderError,
    ProviderNotConfiguredError,
    QuotaExceededError,
    RunNotFoundError,
    RunTakenOverError,
    StoreRefusesWritesError,
    StoreUnavailableError,
    ThoughtgateError,
    UsageError,
    approval_refused,
    exception_line,
    failure_detail,
    failure_kind,
    failure_text,
    store_outage,
)
from thoughtgate.events.catalogue import check_new_events
from thoughtgate.events.payloads import (
    CapabilityResolvedPayload,
    MessageCompletedPayload,
    MessagePartiallyCompletedPayload,
    RunEndedPayload,
    RunResumedPayload,
    RunStartedPayload,
    RunStatus,
    SettingSource,
    TaskCompletedPayload,
    TaskStartedPayload,
    ToolDefinitionPayload,
    WorkerCompletedPayload,
    token_usage,
    trace_metadata,
)
from thoughtgate.events.schema import Event, EventType, NewEvent
from thoughtgate.orchestration.approvals import approval_settled
from thoughtgate.orchestration.leases import LeaseKeeper
from thoughtgate.orchestration.outages import STORE_BACK, left_open, wait_for_store
from thoughtgate.orchestration.recorder import EventRecorder, EventSink
from thoughtgate.orchestration.specs import RunSpec, TaskSpec
from thoughtgate.providers.base import (
    Provider,
    ProviderSettings,
    ToolSpec,
    create_provider,
    split_model,
)
from thoughtgate.providers.clients import shared_clients
from thoughtgate.providers.registry import ENDPOINTS
from thoughtgate.store.base import UNCLAIMED, EventStore, Holder
from thoughtgate.store.durable import DurableRunStore, Quota, RunSpecRecord
from thoughtgate.store.leases import (
    LOST_LEASE,
    UNWRITTEN,
    EndedTask,
    close_run_interrupted,
    end_run,
    retrying,
    suspend,
)
from thoughtgate.store.records import OPEN_RUN_STATUSES, RunRecord, TaskRecord, new_id
from thoughtgate.types import Message, Usage

if TYPE_CHECKING:
    from thoughtgate.orchestration.durable import DurableEngine

__all__ = [
    "ENGINE_CLOSED",
    "SUSPENDED",
    "InlineWorker",
    "ObserverFactory",
    "ProviderFactory",
    "RunRequest",
    "Runtime",
    "TaskSpec",
    "provider_settings_from_config",
]

log = logging.getLogger("thoughtgate.runtime")

InlineWorker = Callable[[str], str | Awaitable[str]]
ProviderFactory = Callable[[str], Provider]
ObserverFactory = Callable[[RunRecord, Disclosure], LoopObserver | None]

SUSPENDED = "its process is shutting down; it resumes in another process"
"""Cancel reason that leaves a durable run open (it resumes elsewhere) instead of closing it."""
ENGINE_CLOSED = "the durable engine was closed before the run began executing"
"""Why a run admitted to execute in this process, whose execution had not begun when the
process's durable engine was closed, ended (:meth:`Runtime.close_unbegun`, ADR 0131)."""
_KEEP_OPEN = frozenset({SUSPENDED, LOST_LEASE, UNWRITTEN, STORE_BACK})
"""Cancel reasons after which the run stays open: another process continues (or closed) it."""

_Begun: TypeAlias = "tuple[RunRecord, RunSpec, ToolRegistry, ResumeLog | None, int] | None"
"""What ``orchestration.resume.begin_execution`` answers."""


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
    started_by: str | None = None
    """The id of the API key that asked for the run (the daemon sets it; operator detail)."""


def provider_settings_from_config(
    config: Config, model: str, *, base_url: str | None = None, api_key: str | None = None
) -> ProviderSettings:
    """CLI flag > environment variable > ``thoughtgate.toml`` > the adapter's default.

    ``config`` already holds the environment over the file (``load_config``); an explicit
    ``base_url`` or ``api_key`` (a command-line flag) wins over both.
    """
    prefix, _ = split_model(model)
    section = ENDPOINTS[prefix].config_section
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
        max_event_bytes=endpoint.max_event_bytes,
        turn_timeout_s=endpoint.turn_timeout_s,
        max_turn_output_chars=endpoint.max_turn_output_chars,
        extra={"thoughtgate": options} if options else {},
    )


class Runtime:
    """Creates and executes runs against one store.

    Provider connections are the process's (:mod:`thoughtgate.providers.clients`): each execution
    keeps them open while it runs, so the turns of a run share keep-alive connections. Use
    ``async with Runtime(...) as runtime:`` to keep them open across runs too; they are closed when
    the block ends.
    """

    #: Pauses (seconds) before trying again to record a run's end (or to read the ended run
    #: back in :meth:`execute`) when the try was lost with its store connection
    #: (``StoreUnavailableError``): 4 tries over ~1.2 s, then the error is raised. A cancelled
    #: run's interruption is tried as ``close_run_interrupted`` does (``CLOSE_RETRY``).
    end_retry: tuple[float, ...] = (0.1, 0.3, 0.8)

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
        self._prepared: dict[str, dict[str, Provider]] = {}
        """Providers built while creating a run (to check its models), used by its first tasks."""
        self._admitted: dict[str, tuple[RunRecord, RunSpec]] = {}
        """Runs this process admitted to execute itself, and their specs, as it stored them:
        their execution here takes both from here instead of reading them back (any other
        process reads them from the store, ``stored_spec``). Such a run is pending and held by
        this process's lease until it executes, so nothing else can have changed it while that
        lease lasts (a later execution reads the run back)."""
        self._claimed: set[str] = set()
        """Admitted runs whose admission was their durable claim (ADR 0031), not yet begun."""
        self._unwritten: set[str] = set()
        """Runs this process admitted to execute itself, durably, whose first execution can
        take no checkpoint (one task, of a model, without tools): :meth:`execute` takes it
        without a DBOS workflow, as a daemon does (ADR 0031, ADR 0046)."""
        self.sinks: list[EventSink] = list(sinks)
        """Observers of every event appended through ``store`` in this process (telemetry): the
        store hands them each committed batch, whichever code path appended it."""
        store.observe(self._feed_sinks)
        self.leases = LeaseKeeper(store, ttl_s=self.config.orchestration.lease_ttl_s)
        """This process's leases on the runs it executes (ADR 0009)."""
        self._client_leases: list[contextlib.AbstractAsyncContextManager[None]] = []
        """Leases on the process's provider clients, one per ``async with`` (not run leases)."""
        self.durable: DurableEngine | None = None
        """The durable engine executing this runtime's runs (``orchestration.durable``)."""
        self._workflows: dict[str, asyncio.Task[Any]] = {}
        """Durable runs executing in this process: their workflow tasks (for cancelling)."""
        self._cancelled_early: dict[str, str] = {}
        """Runs cancelled between starting their workflow and its first step: the reason."""
        self._spending: dict[str, _Spent] = {}
        """What each run executing here was billed so far (its latest execution's), for a close
        made outside that execution (a cancelled admission) without reading the log."""
        self._refusing: str | None = None
        """Why every durable execution that begins here from now on stops at once
        (:meth:`refuse_executions`: a daemon's shutdown), or ``None``."""

    def attach_durable(self, engine: DurableEngine) -> None:
        """Execute runs as durable workflows from now on; approvals go through the engine, so a
        pending one can be answered from any process and survives restarts."""
        from thoughtgate.orchestration.approvals import DurableApprovals

        self.durable = engine
        self.approvals = DurableApprovals(engine, self.store, decider=self.approvals.decider)

    def _durable_ready(self) -> None:
        """Raise unless runs can execute here: no durable engine, or one that is launched."""
        if self.durable is not None and not self.durable.launched:
            raise self.durable.not_launched()

    def holder(self, attempt: int | None = None) -> Holder:
        """This process as the executor of a run, in the claim ``attempt`` (a durable run's):
        what the ends it records name, so that the store refuses them once another execution
        took the run over (ADR 0072)."""
        return Holder(self.leases.owner.owner_id, attempt)

    def tools_for(self, tool_names: Sequence[str]) -> ToolRegistry:
        """The tools a run named, from this process's (a run may call exactly the tools it
        named); ``UsageError`` names any this process lacks."""
        chosen = ToolRegistry()
        for name in tool_names:
            found = self.tools.get(name)
            if found is None:
                known = ", ".join(t.name for t in self.tools) or "none registered"
                raise UsageError(f"unknown tool {name!r}; tools in this process: {known}")
            if chosen.get(name) is None:
                chosen.add(found)
        return chosen

    async def __aenter__(self) -> Runtime:
        lease = shared_clients().lease()
        await lease.__aenter__()
        self._client_leases.append(lease)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._client_leases.pop().__aexit__(exc_type, exc, tb)

    async def _append(
        self, run_id: str, events: list[NewEvent], held_by: Holder | None = None
    ) -> None:
        """Append ``events``; ``held_by``: the execution recording them, refused once another
        execution holds the run (ADR 0090)."""
        check_new_events(events)
        await self.store.append(run_id, events, held_by=held_by)

    async def _feed_sinks(self, events: Sequence[Event]) -> None:
        for sink in self.sinks:
            await sink(events)

    def _default_provider(self, model: str) -> Provider:
        return create_provider(model, provider_settings_from_config(self.config, model))

    # ------------------------------------------------------------------ create
    async def create_run(
        self,
        request: RunRequest,
        *,
        chain_of_thought: str | None = None,
        worker_backend: str | None = None,
        tools: Sequence[str] | None = None,
        named: Callable[[str], None] | None = None,
    ) -> RunRecord:
        """Validate, resolve modes, store the run with its tasks and spec, record the opening
        events. ``tools``: the names of the tools the run may call (default: all of this
        runtime's, for a run this process executes itself). ``named``: as :meth:`admit`'s."""
        run, _ = await self.admit(
            request,
            chain_of_thought=chain_of_thought,
            worker_backend=worker_backend,
            tools=tools,
            named=named,
        )
        return run

    async def admit(
        self,
        request: RunRequest,
        *,
        chain_of_thought: str | None = None,
        worker_backend: str | None = None,
        tools: Sequence[str] | None = None,
        key_id: str | None = None,
        quota: Quota | None = None,
        queue: str | None = None,
        decided: Callable[[RunRecord], None] | None = None,
        committed: Callable[[RunRecord], None] | None = None,
        named: Callable[[str], None] | None = None,
    ) -> tuple[RunRecord, int]:
        """:meth:`create_run` with admission: the run counts against ``key_id``'s ``quota``
        (``QuotaExceededError`` when it is full: nothing is stored), and with ``queue`` it goes
        where the durable engine places it (``DurableEngine.reserve``: executed here at once,
        waiting here, or waiting on the queue for any replica). Also returns the run's
        rank among its key's open runs (1 for a key's only run), its priority in the queue.

        ``decided`` (a run this process executes, without ``queue``): called with the run once
        the store knows it is admitted, before its commit is known to hold, where the store can
        tell that early (``DurableRunStore.admit_run``): the caller may start executing it then
        (ADR 0040), its writes queued behind the admission's. Until this returns the run must
        not be shown to anyone: when the commit fails this raises, nothing of the run is
        stored, and its execution's writes fail.

        ``committed`` (likewise): called with the run once its admission's commit held, in the
        step that learns it, where the store has one before this returns (SQLite's hand-off,
        ``DurableRunStore.admit_run``): the caller's task resumes a turn of the loop later. A
        cancel landing in that turn still makes this raise (and close the run, ADR 0082).

        A durable runtime whose engine is not launched (before its launch, after a launch that
        failed, once closed) admits nothing: a run stored then could not execute, and would
        stay open (ADR 0125).

        ``named``: called with the run's id once it has one, before anything of it is stored:
        a caller whose cancel lands in the admission (``thoughtgate run`` stopped by a signal as
        it starts, ADR 0170) reads the run by it afterwards -- closed ``interrupted`` if it was
        stored after all, absent if not -- where no ``RunRecord`` reached it."""
        self._durable_ready()
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
        names = tuple(t.name for t in self.tools) if tools is None else tuple(dict.fromkeys(tools))
        if not queue:  # this process executes it: it must have every tool the run names
            self.tools_for(names)
        prepared: dict[str, Provider] = {}
        if backend == "provider":
            prepared = await self._prepare([spec.model or model for spec in specs])
        run_id = new_id("run")
        if named is not None:
            named(run_id)
        # A durable run this process executes at once is claimed by its admission (ADR 0031):
        # the daemon reserves its place among its queue's running workflows first.
        # One that can take no checkpoint in that execution -- one task, of a model, without
        # tools -- takes it without a workflow.
        unwritten = len(specs) == 1 and not names and backend == "provider"
        # A run that must wait for a slot may wait in this daemon, held by it (``wait``).
        place = None
        if queue and self.durable is not None:
            place = await self.durable.reserve(run_id, queue, unwritten=unwritten)
        claimed = self.durable is not None and (place == "start" if queue else True)
        held = claimed or not queue or place == "wait"
        run = RunRecord(
            run_id,
            request.prompt,
            model=model,
            chain_of_thought=mode,
            worker_backend=backend,
            metadata=dict(request.metadata),
            owner=self.leases.owner.owner_id if held else None,
            lease_expires_at=self.leases.lease_until() if held else None,
            started_by=request.started_by,
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
        opening = [
            NewEvent(EventType.RUN_STARTED, started),
            NewEvent(EventType.CAPABILITY_RESOLVED, resolved),
        ]
        spec = RunSpec(tuple(specs), names)
        early = None if queue or decided is None else (lambda: decided(run))
        held_now = None if queue or committed is None else (lambda: committed(run))
        if not queue:  # what its execution takes, kept first: it may start before the commit
            self._prepared[run.run_id] = prepared
            if isinstance(self.store, DurableRunStore):
                # A copy: the caller's record stays as admitted while the execution changes its
                # tasks'.
                kept = dataclasses.replace(run, tasks=[dataclasses.replace(t) for t in run.tasks])
                self._admitted[run.run_id] = (kept, spec)
        if held:  # renewed from now until its execution holds it (ADR 0065)
            self.leases.admit(run_id)
        try:
            rank = await self._store_run(
                run,
                spec,
                opening,
                key_id=key_id,
                quota=quota,
                queue=queue,
                claimed=claimed,
                decided=early,
                committed=held_now,
            )
            if claimed:
                self._claimed.add(run_id)
                if unwritten and not queue:
                    self._unwritten.add(run_id)
        except BaseException as exc:
            self.leases.unadmit(run_id)
            if place is not None and self.durable is not None:
                self.durable.unreserve(run_id)
            # An execution started early (``decided``) finds neither: it reads the run, which
            # is not there, and fails; a provider it took already is its own to close.
            self._admitted.pop(run_id, None)
            await _close_all(self._prepared.pop(run_id, prepared if queue else {}).values())
            if isinstance(exc, asyncio.CancelledError):
                # A queued run nobody claimed yet is closed too: no workflow was put on a queue
                # for it, and a sweep would put it on one -- it would execute (ADR 0082).
                holder = self.holder() if held else UNCLAIMED
                await self._close_cancelled_admission(run, _cancel_reason(exc), holder)
            raise
        if queue:  # another process may execute it: nothing prepared here is of use
            await _close_all(prepared.values())
            if self.durable is not None and queue == self.durable.queue:
                # This daemon may start it at once (``DurableEngine.submit``, which forgets it
                # when the run waits in the queue instead): its first execution reads nothing
                # back (ADR 0029).
                kept = dataclasses.replace(run, tasks=[dataclasses.replace(t) for t in run.tasks])
                self._admitted[run.run_id] = (kept, spec)
        return run, rank

    async def _close_cancelled_admission(self, run: RunRecord, reason: str, holder: Holder) -> None:
        """A cancel landed while ``run``'s admission was committing: the commit may have
        happened all the same (a store call cancelled mid-way may still commit, ADR 0059), and
        then the run would show ``running`` until its lease expired and a sweep took it --
        never, for a process alone on its store that does not sweep (an MCP server). Close it
        ``interrupted`` with the cancel's reason if it was stored (ADR 0072). Its tasks are
        known, so the close is one ``finish_run``, queued behind the admission where the store
        orders writes (SQLite): it finds the run exactly when the admission committed.

        Its usage is what an execution begun in the admission's hand-off was billed so far
        (nothing, if none began), never a read of the log first: a read would let that
        execution, queued behind this close, run to its end ahead of it (ADR 0131)."""
        spent = self._spending.get(run.run_id) or _Spent()
        try:
            with self.leases.ending(run.run_id):
                await close_run_interrupted(
                    self.store,
                    run.run_id,
                    reason,
                    usage=spent.usage.to_dict(),
                    task_usage=spent.by_task(),
                    held_by=holder,
                    tasks=[dataclasses.replace(t) for t in run.tasks],
                )
        except RunNotFoundError:
            pass  # not stored: nothing to close
        except (StoreUnavailableError, RunTakenOverError):
            pass  # logged: the run is left to the lease sweep, or is another execution's
        except Exception as exc:
            log.warning("could not record that run %s was interrupted: %s", run.run_id, exc)

    async def _store_run(
        self,
        run: RunRecord,
        spec: RunSpec,
        opening: list[NewEvent],
        *,
        key_id: str | None,
        quota: Quota | None,
        queue: str | None,
        claimed: bool = False,
        decided: Callable[[], None] | None = None,
        committed: Callable[[], None] | None = None,
    ) -> int:
        """Store the run with its tasks, its spec (where the store keeps specs) and its
        ``opening`` events -- in one transaction where the store admits runs (one commit per
        run start, not two); returns its rank among its key's open runs. ``claimed``: the run
        is stored as its durable claim leaves it (``DurableRunStore.claim_run``: held by
        ``run.owner``, attempt 1, not waiting in a queue), for this process executes it now."""
        check_new_events(opening)
        if not isinstance(self.store, DurableRunStore):
            if queue or quota:
                raise UsageError("queued runs and quotas need a store that keeps run specs")
            await self.store.create_run(run)
            await self._append(run.run_id, opening)
            return 1
        record = RunSpecRecord(
            run.run_id,
            spec.to_json(),
            key_id=key_id,
            durable=self.durable is not None,
            resume="queue" if queue else "manual",
            queue=queue,
            attempts=1 if claimed else 0,
            queued_at=time.time() if queue and run.owner is None else None,
        )
        admission = await self.store.admit_run(
            run, record, quota=quota, events=opening, decided=decided, committed=committed
        )
        if not admission.admitted:
            raise QuotaExceededError(admission.reason, retry_after=admission.retry_after)
        return admission.rank

    def _validate(self, backend: str, model: str | None, specs: Sequence[TaskSpec]) -> None:
        if backend == "provider":
            for spec in specs:
                chosen = spec.model or model
                if not chosen:
                    raise UsageError(
                        "this run needs a model: name one as PROVIDER:MODEL (for example "
                        "anthropic:claude-sonnet-4-5), or set orchestration.default_model in "
                        "thoughtgate.toml"
                    )
                split_model(chosen)
        else:
            for spec in specs:
                name = spec.worker or "default"
                if name not in self.inline_workers:
                    known = ", ".join(sorted(self.inline_workers)) or "none registered"
                    raise UsageError(f"no inline worker named {name!r}; known: {known}")

    async def _prepare(self, models: Iterable[str | None]) -> dict[str, Provider]:
        """Build each model's provider once, so a missing key or an unknown model is a
        ``UsageError`` now instead of a failed run later. Only caller mistakes raise here; a
        provider that cannot be built for another reason is left for the run to report.
        Building an adapter opens no connection and no client (clients are the process's, made on
        the first request: ``providers.clients``)."""
        built: dict[str, Provider] = {}
        for model in dict.fromkeys(m for m in models if m):
            try:
                built[model] = self.provider_factory(model)
            except UsageError:
                await _close_all(built.values())
                raise
            except Exception as exc:  # not the caller's fault; the run will say
                log.warning("cannot build a provider for %s yet: %s", model, exc)
        return built

    # ------------------------------------------------------------------ execute
    async def execute(self, run_id: str) -> RunRecord:
        """Run every task in order; the run always ends with exactly one terminal event.

        Cancelling the task that runs this (Ctrl-C, an MCP cancel, a daemon shutdown) ends the
        run ``interrupted``, its unfinished tasks first; the cancel message, if any, is the
        recorded reason. The ``CancelledError`` is then re-raised. With a durable engine the run
        executes as a workflow in this process, and a cancel reaches the workflow the same way.
        Returns the ended run as the store has it.
        """
        await self.run_to_end(run_id)
        # The end is stored: a lost connection here must not report the run as failed.
        return await retrying(
            lambda: self.store.get_run(run_id), self.end_retry, "read back the ended", run_id
        )

    async def run_to_end(self, run_id: str) -> None:
        """:meth:`execute` without reading the ended run back: for a caller that has no use for
        it (the daemon, whose clients read runs through its API), one store read less a run."""
        self._durable_ready()
        async with shared_clients().lease():  # one set of provider connections for all turns
            if self.durable is None:
                await self._execute(run_id)
            else:
                await self._execute_here(run_id)

    async def _execute_here(self, run_id: str) -> None:
        """A durable run executed here, now, by its caller's task (``thoughtgate run``, MCP).

        A cancel of that task ends the run wherever it lands (ADR 0072) and leaves no workflow
        behind (ADR 0093): DBOS records no outcome for a cancelled workflow, so its row would
        stay ``PENDING`` under this process's executor id, which no later process recovers and
        no sweep deletes. Once the run has ended its workflow is cancelled, and the next sweep
        deletes it with the ended runs'. DBOS writes a new workflow in a thread that a cancel
        does not stop, so a cancel while it starts waits for that write (a DBOS transaction),
        then stops the run as one cancelled while it executes; a second cancel meanwhile
        leaves the row as before."""
        durable = self.durable
        assert durable is not None
        cancelled: asyncio.CancelledError | None = None
        try:
            if run_id not in self._admitted:  # else the workflow takes it (its claim checks it)
                run = await self.store.get_run(run_id)
                if run.status not in OPEN_RUN_STATUSES:
                    self.forget_admitted(run_id)
                    await _close_all(self._prepared.pop(run_id, {}).values())
                    raise UsageError(f"run {run_id!r} has already ended ({run.status})")
            # Its first execution without a workflow when it can take no checkpoint (ADR 0046):
            # its lease, held from its admission, is what a resume needs, as for a daemon's run.
            unwritten = run_id in self._unwritten
            self._unwritten.discard(run_id)
            starting = asyncio.ensure_future(durable.start(run_id, unwritten=unwritten))
            try:
                done = await asyncio.shield(starting)
            except asyncio.CancelledError as exc:
                await asyncio.wait([starting])
                if starting.cancelled() or starting.exception() is not None:
                    raise  # nothing started: closed below, as before its workflow began
                done, cancelled = starting.result(), exc
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):  # before its workflow began
                await self._close_unbegun(run_id, _cancel_reason(exc))
            self.forget_admitted(run_id)
            raise
        try:
            if cancelled is not None:  # while its workflow started: it may begin any moment
                raise cancelled
            await asyncio.shield(done)
        except asyncio.CancelledError as exc:
            reason = _cancel_reason(exc)
            if not done.done() and not self.cancel(run_id, reason):
                self._cancelled_early[run_id] = reason  # its workflow has not begun yet
            with contextlib.suppress(BaseException):
                await done
            if reason not in _KEEP_OPEN:  # a no-op once it is closed; else billed as its log says
                await self._interrupted(run_id, None, reason)
                await durable.cancel_ended_workflow(run_id)
            raise

    def cancel(self, run_id: str, reason: str) -> bool:
        """Cancel a durable run executing in this process (``reason`` becomes the recorded one,
        or with ``SUSPENDED`` the run stays open to resume elsewhere)."""
        task = self._workflows.get(run_id)
        if task is None or task.done():
            return False
        task.cancel(reason)
        return True

    async def stop_started(self, run_id: str, reason: str, done: asyncio.Future[Any]) -> None:
        """Cancel, with ``reason``, a durable run this process started, whether its execution
        has begun or not (``done``: where its start or execution stands), and wait until
        ``done`` is over (``DurableEngine.withdraw``, ADR 0082). An execution that has begun
        records its end as any cancelled one; one that begins after this ends the run before
        it does anything (:meth:`execute_workflow`)."""
        if not self.cancel(run_id, reason):
            self._cancelled_early[run_id] = reason
        try:
            await asyncio.wait([done])
        finally:
            if done.done():
                self._cancelled_early.pop(run_id, None)

    def refuse_executions(self, reason: str) -> None:
        """Every durable execution that begins in this process from now on stops before it
        does anything, with ``reason`` (``SUSPENDED``: the run stays open to resume elsewhere).

        A daemon's shutdown stops the executions under way (:meth:`workflow_tasks`); this stops
        those whose workflow DBOS started but whose first step had not run yet -- a run started
        here at once, or one DBOS's queue worker took from the queue a moment before: neither
        is among them yet, and each would otherwise claim and execute its run while the daemon
        closes its databases under it (ADR 0090)."""
        self._refusing = reason

    @property
    def executing(self) -> frozenset[str]:
        """Durable runs this process is executing now."""
        return frozenset(self.workflow_tasks())

    def workflow_tasks(self) -> dict[str, asyncio.Task[Any]]:
        """The tasks of the durable runs executing in this process, by run id."""
        return {r: t for r, t in self._workflows.items() if not t.done()}

    async def _execute(self, run_id: str) -> None:
        try:
            await self._execute_admitted(run_id)
        except asyncio.CancelledError as exc:  # while it read the run, before it held it
            await self._close_unbegun(run_id, _cancel_reason(exc))
            raise
        finally:  # it holds its run while it executes; renewed no more if it never did
            self.leases.unadmit(run_id)

    async def _close_unbegun(self, run_id: str, reason: str) -> bool:
        """Close ``interrupted``, with ``reason``, a run this process admitted as its own whose
        execution was cancelled before it held the run, and say whether it was one (ADR 0072).

        A cancel that reaches an execution while it still reads the run back or starts its
        workflow ends nothing by itself: the run would show ``running`` on every surface until
        its admission's renewal gave up (four leases) and a sweep took it. Nothing is done for
        a run whose execution holds it (that execution records its end), for a run not
        admitted here, nor for a cancel that leaves the run open (``SUSPENDED``, a lost
        lease). A run another execution took over meanwhile is left to it."""
        if reason in _KEEP_OPEN or not self.leases.is_admitted(run_id):
            return False
        self.forget_admitted(run_id)
        self._unwritten.discard(run_id)
        await _close_all(self._prepared.pop(run_id, {}).values())
        await self._interrupted(run_id, _Spent(), reason)
        return True

    async def close_unbegun(self, reason: str = ENGINE_CLOSED) -> None:
        """Close ``interrupted``, with ``reason``, every run this process admitted to execute
        itself whose execution has not begun (``DurableEngine.close``): once the engine is
        closed none of them can begin here, and each would stay ``pending`` under this process's
        lease while it lives -- never swept, for a process alone on its store (ADR 0131). A run
        admitted onto a queue is not this process's (another replica takes it), nor is one
        whose execution holds it (it records its own end); a run waiting in a daemon's line
        went back on the queue first (``DurableEngine.stop_starting``).

        A daemon shutting down (:meth:`refuse_executions` with a reason that keeps runs open)
        hands them back instead, as it does the executions it stops: left open, their leases
        ended now, so that the next sweep of any replica resumes them (ADR 0090)."""
        executing = self.executing
        unbegun = [r for r in self._admitted if r not in executing and self.leases.is_admitted(r)]
        if self._refusing not in _KEEP_OPEN:
            for run_id in unbegun:
                await self._close_unbegun(run_id, reason)
            return
        for run_id in unbegun:
            self.forget_admitted(run_id)
            self._unwritten.discard(run_id)
            await _close_all(self._prepared.pop(run_id, {}).values())
        if unbegun:
            await self.store.renew_leases(self.leases.owner.owner_id, 0.0, unbegun)

    async def _execute_admitted(self, run_id: str) -> None:
        admitted = self._admitted.pop(run_id, None)
        spec: RunSpec | None = None
        if admitted is not None and time.time() < (admitted[0].lease_expires_at or 0.0):
            run, spec = admitted  # as this process stored it: no read back (ADR 0021, amended)
        else:
            run = await self.store.get_run(run_id)
            if run.status not in OPEN_RUN_STATUSES:
                await _close_all(self._prepared.pop(run_id, {}).values())
                raise UsageError(f"run {run_id!r} has already ended ({run.status})")
        try:
            spec = spec or await self.stored_spec(run)
            tools = self.tools_for(spec.tools)
        except UsageError:
            await _close_all(self._prepared.pop(run_id, {}).values())
            raise
        await self._run_held(run, spec.tasks, tools, DirectSteps())

    async def stored_spec(self, run: RunRecord) -> RunSpec:
        """The run's spec as the store keeps it, whichever process created the run: this one
        reads it back like any other (nothing of a run lives only in its creator's memory). A
        run recorded without a spec (by a store that keeps none) gets one from its task rows: no
        system prompt, history or tools to go on."""
        if isinstance(self.store, DurableRunStore):
            record = await self.store.get_run_spec(run.run_id)
            if record is not None:
                return RunSpec.from_json(record.spec)
        return RunSpec(tuple(TaskSpec(t.prompt, model=t.model) for t in run.tasks))

    def claimed_from_line(self, run_id: str, lease_until: float) -> None:
        """A run admitted to wait in this daemon's line was just claimed by its start from
        there (attempt 1, ``DurableEngine``, ADR 0099), its lease set to no earlier than
        ``lease_until``: its first execution takes it as a run its admission claimed, without
        claiming it again."""
        admitted = self._admitted.get(run_id)
        if admitted is not None:
            self._claimed.add(run_id)
            admitted[0].lease_expires_at = lease_until

    def forget_admitted(self, run_id: str) -> tuple[RunRecord, RunSpec] | None:
        """The run and its spec as this process admitted them, once: for its first execution
        here (``orchestration.resume.begin_execution``), or dropped when it goes elsewhere. Its
        lease is renewed no more as an admitted run's: its execution holds it from here, or
        another process takes it (ADR 0065)."""
        self._claimed.discard(run_id)
        self.leases.unadmit(run_id)
        return self._admitted.pop(run_id, None)

    async def execute_workflow(
        self,
        run_id: str,
        *,
        unwritten: bool = False,
        holding: Callable[[Holder], None] | None = None,
    ) -> str:
        """The body of a run's durable workflow (``orchestration.durable``), in whichever process
        took it: claim the run, say it resumed when it did, then run its tasks through
        checkpointed steps. Returns the run's status. ``unwritten``: the first execution of a
        run that can take no checkpoint, without a workflow (``DurableEngine.submit``).
        ``holding``: told this execution's holder once its claim took the run -- what the
        engine's hand-back of a run whose workflow it lost names (ADR 0093).

        This process may execute one run twice at once: a stalled execution and the one its own
        queue took the run back with (a later claim). What the first leaves behind as it ends is
        its own only -- the task cancelled for the run, the lease renewed for it -- never the
        second's."""
        from thoughtgate.orchestration.resume import begin_execution

        assert isinstance(self.store, DurableRunStore)
        claimed = run_id in self._claimed
        admitted = self.forget_admitted(run_id)
        early = self._cancelled_early.pop(run_id, None) or self._refusing
        if early is not None:
            if early not in _KEEP_OPEN and admitted is not None:
                # Cancelled before it began (a daemon's start, ADR 0082): nothing else records
                # its end. Held as its admission stored it: this process's, claimed or not,
                # or nobody's (a queued run this daemon took at once).
                first = admitted[0]
                held = self.holder(1 if claimed else 0) if first.owner else UNCLAIMED
                await self._interrupted(run_id, _Spent(), early, holder=held)
            raise asyncio.CancelledError(early)
        task = asyncio.current_task()
        assert task is not None
        durable = self.durable
        assert durable is not None
        self._workflows[run_id] = task
        # Where its workflow's steps begin: an execution that waited out an outage of its
        # store goes back there and continues from its checkpoints (ADR 0152).
        mark = None if unwritten else durable.step_mark()
        holder: Holder | None
        try:
            while True:
                holder = None  # this round's claim, once it took the run
                try:
                    begun = await self._begin_held(
                        begin_execution(self, run_id, admitted, claimed=claimed)
                    )
                except Exception as exc:
                    outage = store_outage(exc)
                    if outage is None:
                        raise
                else:
                    if begun is None:
                        return (await self.store.get_run(run_id)).status
                    run, spec, tools, resumed, attempt = begun
                    holder = self.holder(attempt)
                    if holding is not None:
                        holding(holder)
                    try:
                        steps = _DurableSteps.of(resumed, run.chain_of_thought, unwritten=unwritten)
                        return await self._run_held(
                            run, spec.tasks, tools, steps, attempt=attempt, waits_out_outages=True
                        )
                    except RunTakenOverError:
                        raise  # its end is another execution's: never this one's (ADR 0072)
                    except Exception as exc:
                        outage = store_outage(exc)
                        if outage is None:  # recorded as run.failed / run.error: it is done
                            log.warning("run %s ended with %s: %s", run_id, type(exc).__name__, exc)
                            return (await self.store.get_run(run_id)).status
                await self._wait_out(run_id, outage, task, holder, says_why=not unwritten)
                if mark is None:  # no workflow yet: it continues as one, from its log
                    raise asyncio.CancelledError(STORE_BACK)
                durable.replay_from(mark)
                admitted, claimed = None, False  # claimed again, as a resume is
        finally:
            if self._workflows.get(run_id) is task:  # not a later execution's (see above)
                del self._workflows[run_id]

    async def _wait_out(
        self,
        run_id: str,
        outage: StoreUnavailableError,
        task: asyncio.Task[Any],
        holder: Holder | None,
        *,
        says_why: bool,
    ) -> None:
        """Wait for the store of ``run_id``, whose execution here its ``outage`` stopped, for
        ``durability.store_outage_wait_s`` at most (``orchestration.outages``, ADR 0152);
        raise :func:`~thoughtgate.orchestration.outages.left_open`'s error past it, the run
        left open. Meanwhile this process holds the run (its own sweep leaves it alone, and
        the store's first answer renews its lease). Once the store answers, with ``says_why``
        (a workflow continues it here; else the engine records it, handing the run to one),
        the run records why it resumes, as ``holder``: the claim that stopped (``None``: its
        claim is what failed)."""
        wait_s = self.config.durability.store_outage_wait_s
        deadline = time.monotonic() + wait_s
        self.leases.hold(run_id, task)
        try:
            while True:
                left = deadline - time.monotonic()
                if not await wait_for_store(self.leases, run_id, outage, left):
                    raise left_open(run_id, outage, wait_s) from None  # (its words say why)
                if not says_why:
                    return
                try:
                    owner = self.leases.owner.owner_id
                    await suspend(
                        self.store, run_id, STORE_BACK, queued=False, previous=owner, held_by=holder
                    )
                    return
                except Exception as exc:
                    again = store_outage(exc)
                    if again is None:
                        raise
                    outage = again
        finally:
            self.leases.release(run_id, task)

    async def _begin_held(self, beginning: Awaitable[_Begun]) -> _Begun:
        """``begin_execution``, let finish when the execution is cancelled meanwhile: its claim
        may commit all the same, and the run would stay open, held by this process, until a
        sweep took it (ADR 0082). Once it is known what it took, a run it holds is closed
        ``interrupted`` with the cancel's reason, as the claim's (a cancel that keeps the run
        open leaves it to the sweep, as before), and the cancel goes on."""
        begun = asyncio.ensure_future(beginning)
        try:
            return await asyncio.shield(begun)
        except asyncio.CancelledError as exc:
            await asyncio.wait([begun])
            held = None if begun.cancelled() or begun.exception() else begun.result()
            reason = _cancel_reason(exc)
            if held is not None and reason not in _KEEP_OPEN:
                run, attempt = held[0], held[4]
                await self._interrupted(run.run_id, _Spent(), reason, holder=self.holder(attempt))
            raise

    async def _run_held(
        self,
        run: RunRecord,
        specs: Sequence[TaskSpec],
        tools: ToolRegistry,
        steps: Steps,
        *,
        attempt: int | None = None,
        waits_out_outages: bool = False,
    ) -> str:
        """Execute a run this process holds, renewing its lease, until it ends or is cancelled.
        ``tools``: the run's own (``tools_for`` its spec), a parameter of its execution.
        ``attempt``: the claim this execution holds a durable run by (``claim_run``'s answer).
        ``waits_out_outages``: a store outage stops it, raised, with nothing recorded of it
        (ADR 0152).
        Its end is recorded only while this execution still holds the run (ADR 0072): else
        ``RunTakenOverError``, the end not stored. Returns the status it ended the run with."""
        run_id = run.run_id
        task = asyncio.current_task()
        self.leases.hold(run_id, task)
        spent = self._spending[run_id] = _Spent()
        execution = _Execution(specs, tools, steps, self.holder(attempt), waits_out_outages)
        try:
            return await self._execute_tasks(run, execution, spent)
        except asyncio.CancelledError as exc:
            # Also when the cancel lands while the end was being recorded: closing a run that
            # has ended is a no-op, so the run ends exactly once either way.
            reason = _cancel_reason(exc)
            if reason in _KEEP_OPEN:
                self.leases.release(run_id, task)
            else:
                await self._interrupted(run_id, spent, reason, execution.holder)
            raise
        finally:
            self.leases.release(run_id, task)  # its own hold only: not a later execution's
            if self._spending.get(run_id) is spent:  # likewise
                del self._spending[run_id]
            await _close_all(self._prepared.pop(run_id, {}).values())

    async def _execute_tasks(self, run: RunRecord, execution: _Execution, spent: _Spent) -> str:
        """The tasks in order, then the run's end; ``spent`` adds up their model turns' usage as
        they return. Returns the run's status."""
        disclosure = Disclosure.of(run.chain_of_thought)
        results: list[LoopResult] = []
        try:
            # No update_run(status="running") first: the first task's task.started marks the
            # run running in its append's transaction (ADR 0020's projection; ADR 0021), and a
            # durable run was marked by its claim.
            last = len(run.tasks) - 1
            for i, (task, spec) in enumerate(zip(run.tasks, execution.specs, strict=True)):
                # The last task's end is stored with the run's (one commit). A durable run too:
                # a task's end is an effect, not a checkpoint (ADR 0025), so a resume that finds
                # no end in the log ends the task again, with the run.
                defer = i == last
                result = await self._execute_task(
                    run,
                    task,
                    spec,
                    disclosure,
                    execution.last_task() if defer else execution,
                    spent,
                    defer=defer,
                )
                results.append(result)
        except RunTakenOverError:
            raise  # another execution holds the run: its end is that one's (ADR 0090)
        except Exception as exc:
            if execution.waits_out(exc):
                raise  # no failed end: it waits for the store and continues (ADR 0152)
            if isinstance(exc, ProviderNotConfiguredError):  # its readers see exc.public only
                log.warning("run %s needs a provider this process lacks: %s", run.run_id, str(exc))
            # thoughtgate's own errors fail the run; anything else is an error in it.
            ours = isinstance(exc, ThoughtgateError)
            await self._finish(
                run.run_id,
                EventType.RUN_FAILED if ours else EventType.RUN_ERROR,
                "failed" if ours else "error",
                spent,
                (
                    failure_text(exc),
                    _error_type(exc),
                    kept_detail(run.chain_of_thought, failure_detail(exc)),
                ),
                execution.holder,
                waits_out=execution.waits_out,
            )
            raise
        status = _run_status([r.status for r in results])
        failed = next((r for r in results if r.status != "completed" and r.error), None)
        event = EventType.RUN_FAILED if status == "failed" else EventType.RUN_SETTLEMENT_COMPLETED
        error = (
            None
            if failed is None
            else (
                failed.error or "",
                failed.error_type,
                kept_detail(run.chain_of_thought, failed.error_detail),
            )
        )
        # A direct run's tasks are known here as they ended (the last one is in spent.ended):
        # no need to read the run back to find the unfinished ones.
        known = run.tasks if spent.ended is not None else None
        await self._finish(
            run.run_id,
            event,
            status,
            spent,
            error,
            execution.holder,
            known,
            waits_out=execution.waits_out,
        )
        return status

    async def _interrupted(
        self,
        run_id: str,
        spent: _Spent | None,
        reason: str,
        holder: Holder | None = None,
    ) -> None:
        """Close a cancelled run; never let a failing store hide the cancellation itself.
        ``spent``: what its execution was billed, by task, its last task's end and last events
        held for the run's ending (``None``: what its log says, ADR 0131).
        ``holder``: the execution cancelled (default: this process, any attempt): a run another
        execution took over is left to it (ADR 0072)."""
        try:
            # Retried while the store is briefly unavailable (``CLOSE_RETRY``, ~4 s). A daemon
            # shutdown cancels its runs together and gathers them, so the pauses overlap,
            # they do not add up per run. The lease is renewed meanwhile, and no longer once
            # this gives up: the lease sweep closes the run then (ADR 0060).
            with self.leases.ending(run_id, asyncio.current_task()):
                tail = [] if spent is None else [*spent.tail]
                if spent is not None:  # a billed turn's record the cancel cut off: its stand-in
                    tail += await self._stand_ins(run_id, spent, spent.held())
                await close_run_interrupted(
                    self.store,
                    run_id,
                    reason,
                    usage=None if spent is None else spent.usage.to_dict(),
                    task_usage=None if spent is None else spent.by_task(),
                    held_by=holder or self.holder(),
                    ended=None if spent is None else spent.ended,
                    tail=tail,
                )
        except (StoreUnavailableError, RunTakenOverError):
            pass  # logged: the run is left to the lease sweep, or is the other execution's
        except Exception as exc:
            log.warning("could not record that run %s was interrupted: %s", run_id, exc)

    async def _stand_ins(
        self,
        run_id: str,
        spent: _Spent,
        known: Sequence[NewEvent] = (),
        task_id: str | None = None,
    ) -> list[NewEvent]:
        """The stand-in ``agent.response`` of each billed turn (of ``task_id``'s only, if given)
        whose own record is neither in the run's log nor among ``known`` (events that go with
        the stand-ins): a cancel or a failure cut it off between the provider's answer and its
        record (ADR 0131, amended). Read from the log only when there is such a turn (a turn's
        record is decided before a cancel is raised: ``EventRecorder``); a read that fails
        leaves them out (the run then says more than its log, as before), never in twice."""
        pending = [
            event
            for owner, event in spent.unrecorded.items()
            if task_id is None or owner == task_id
        ]
        if not pending:
            return []
        try:
            logged = await self.store.read_types(run_id, (EventType.AGENT_RESPONSE,))
        except Exception as exc:
            log.warning("run %s: could not read which billed turns it recorded: %s", run_id, exc)
            return []
        seen = {(event.task_id, event.payload.get("turn")) for event in logged}
        seen |= {
            (event.task_id, event.payload.get("turn"))
            for event in known
            if event.type == EventType.AGENT_RESPONSE
        }
        return [e for e in pending if (e.task_id, e.payload.get("turn")) not in seen]

    async def answer_approval(
        self, run_id: str, call_id: str, decision: Decision, *, by: str = ""
    ) -> None:
        """Answer a tool approval the run waits for, wherever it executes (with durable runs:
        through any process on the store). Every surface (HTTP, MCP, the web page) answers
        through here, so each refuses the same cases with the same words:
        :class:`ApprovalNotPendingError` when the run ended, the call was already settled, or no
        approval is pending for it; ``RunNotFoundError`` for an unknown run;
        :class:`StoreRefusesWritesError` while the store refuses writes (ADR 0165): recording
        the answer is the run's next write, which would be refused, stopping the run with the
        answer lost after its answerer was told it was taken; refused, the approval stays
        pending and can be answered once the store takes writes again."""
        run = await self.store.get_run(run_id)
        refusal = self.store.write_refusal()
        if refusal is not None and run.status in OPEN_RUN_STATUSES:
            raise StoreRefusesWritesError(approval_refused(refusal), reason=refusal)
        if await self.approvals.answer(run_id, call_id, decision, by=by):
            return
        if run.status not in OPEN_RUN_STATUSES:
            raise ApprovalNotPendingError(
                f"run {run_id!r} has already ended ({run.status})", reason="run_ended"
            )
        if await approval_settled(self.store, run_id, call_id):
            raise ApprovalNotPendingError(
                f"the approval for call {call_id!r} was already settled", reason="settled"
            )
        raise ApprovalNotPendingError(
            f"no approval is pending for call {call_id!r} in run {run_id!r}", reason="not_pending"
        )

    async def resumed_event(
        self, run_id: str, payload: RunResumedPayload, holder: Holder | None = None
    ) -> None:
        """Append ``run.resumed``, as ``holder``: the claim it says resumed (ADR 0090)."""
        await self._append(run_id, [NewEvent(EventType.RUN_RESUMED, payload)], holder)

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
        created: Callable[[RunRecord], None] | None = None,
        named: Callable[[str], None] | None = None,
    ) -> RunRecord:
        """Create the run and execute it (:meth:`execute`); ``created`` is called with the run
        once it is stored, before its execution (a caller following it starts there).

        One task for both, so a cancel of it can land nowhere that leaves the run open: while
        the run is admitted (if it was stored all the same, it is closed), between its
        admission and its execution, or while it executes, it ends ``interrupted`` with the
        cancel's message as its reason; before the task first ran, nothing was created
        (ADR 0072). A caller that cancels a separate execution task instead may cancel it
        before it ever runs, which ends nothing. ``named``: as :meth:`admit`'s."""
        run = await self.create_run(
            request, chain_of_thought=chain_of_thought, worker_backend=worker_backend, named=named
        )
        if created is not None:
            created(run)
        return await self.execute(run.run_id)

    async def _finish(
        self,
        run_id: str,
        event_type: str,
        status: RunStatus,
        spent: _Spent,
        failure: tuple[str, str | None, str | None] | None,
        holder: Holder,
        tasks: Sequence[TaskRecord] | None = None,
        *,
        waits_out: Callable[[BaseException], bool] = lambda _: False,
    ) -> None:
        """The run's terminal event and status in one store transaction; tasks that never got
        to run end too, and ``spent.ended``, the last task's own end, goes first in it. Nothing
        happens if another process already closed the run; ``RunTakenOverError`` (nothing
        stored) if another execution holds it now, ``holder`` being this one's (ADR 0072).
        ``spent``: what the execution was billed: the run's usage, and each task's that this
        end closes (one whose own ``task.completed`` was not stored, found by reading the run
        back, ``tasks`` being ``None``), with the stand-in of a billed turn whose record was not
        stored either (ADR 0131, amended).
        ``failure`` is the error, its type and its detail (``RunEndedPayload``'s ``error``,
        ``error_type``, ``error_detail``), if any. ``waits_out``: whether a store error stops
        the execution to wait for the store (a durable one's outage, ADR 0152): its log line
        then says so, not that the run waits for its lease to expire."""
        usage = spent.usage
        payload: RunEndedPayload = {"status": status, "usage": token_usage(usage)}
        error = failure[0] if failure else None
        if error and failure:
            payload["error"] = error
            if failure[1]:
                payload["error_type"] = failure[1]
            if failure[2]:
                payload["error_detail"] = failure[2]
        not_run = "not run: the run failed before this task started"
        # A task that had begun and is still open here lost its own end (its append failed):
        # it ran, so "not run" would be untrue of it.
        cut = "failed: the run ended before this task's own end could be recorded"
        try:
            with self.leases.ending(run_id, asyncio.current_task()):  # its hold only
                # A stand-in is pending only when a task's own end, which records it, was lost.
                stand_ins = await self._stand_ins(run_id, spent, spent.held())
                await end_run(
                    self.store,
                    run_id,
                    NewEvent(event_type, payload),
                    status=status,
                    usage=usage.to_dict(),
                    error=error,
                    task_status="failed",
                    task_error=not_run,
                    begun_error=cut,
                    held_by=holder,
                    ended=spent.ended,
                    tasks=tasks,
                    tail=stand_ins,
                    retry=self.end_retry,
                    task_usage=spent.by_task(),
                )
        except StoreUnavailableError as exc:
            if waits_out(exc):
                log.warning(
                    "run %s: its end (%s) could not be stored (%s); the run waits for its "
                    "store and continues from its checkpoints once it answers",
                    run_id,
                    status,
                    exc,
                )
            else:
                log.error(
                    "run %s: its end (%s) could not be stored (%s); unless it was, the run "
                    "stays open until its lease expires and a sweep takes it",
                    run_id,
                    status,
                    exc,
                )
            raise

    async def _execute_task(
        self,
        run: RunRecord,
        task: TaskRecord,
        spec: TaskSpec,
        disclosure: Disclosure,
        execution: _Execution,
        spent: _Spent,
        *,
        defer: bool = False,
    ) -> LoopResult:
        """One task, started and ended, its model turns' usage added to ``spent`` as they
        return; with ``defer`` its end is not stored here but handed to the run's ending
        (``spent.ended``), which stores both at once."""
        defer_end = spent if defer else None
        steps = execution.steps
        recorder = EventRecorder(
            self.store, run.run_id, hold_last=defer_end is not None, held_by=execution.holder
        )
        held: list[NewEvent] = []
        started = time.monotonic()
        resumed = steps.resumed
        observer: LoopObserver | None = None
        setup_failed: Exception | None = None
        if run.worker_backend != "inline":
            try:
                observer = self._observer(run, spec, disclosure)
            except Exception as exc:  # reported below, after task.started, as the task's failure
                setup_failed = exc

        async def begin() -> None:
            task.status = "running"  # in the index with task.started (ADR 0020)
            if resumed is not None and resumed.task_has(task.task_id, EventType.TASK_STARTED):
                return
            opened: TaskStartedPayload = {
                "index": task.index,
                "prompt": task.prompt,
                "backend": task.backend,
                "model": task.model,
            }
            if run.worker_backend != "inline":
                _describe_task(opened, spec, offered_tools(execution.tools, observer))
            # Not waited for: the provider's stream opens while it commits, and the task's
            # next append waits for it (ADR 0021, amended).
            await recorder.start([NewEvent(EventType.TASK_STARTED, opened, task_id=task.task_id)])

        try:
            try:
                await steps.effect(f"{task.task_id}: start", begin)
                if setup_failed is not None:
                    raise setup_failed
                if run.worker_backend == "inline":
                    result = await steps.run(
                        f"{task.task_id}: inline worker",
                        lambda: self._inline(spec, task, recorder, run.chain_of_thought),
                        _LOOP_RESULT,
                    )
                else:
                    result = await self._provider(
                        run, spec, task, recorder, disclosure, observer, execution, spent
                    )
                held = recorder.take_held()  # the task's last events, for the run's ending
                if defer_end is not None:  # a cancel from here on still records them
                    defer_end.tail = held
            finally:
                await recorder.close()
        except RunTakenOverError:
            raise  # its events are refused: another execution holds the run (ADR 0090)
        except Exception as exc:
            if execution.waits_out(exc):
                raise  # nothing recorded: it waits for the store and continues (ADR 0152)
            error, detail = failure_text(exc), failure_detail(exc)
            if defer_end is not None:  # _task_aborted stores them
                defer_end.tail = []
            await steps.effect(
                f"{task.task_id}: aborted",
                lambda: self._task_aborted(
                    run,
                    task,
                    (error, detail),
                    resumed,
                    held,
                    execution.holder,
                    spent,
                ),
            )
            raise

        async def end() -> None:
            task.status = result.status
            task.output = result.answer
            task.usage = result.usage.to_dict()
            task.error = result.error
            task.reasoning = (
                result.reasoning if disclosure.on_display and result.reasoning else None
            )
            # The index takes the task's end from worker.completed and task.completed, in their
            # append's transaction (ADR 0020); only the reasoning, which no one event carries,
            # is saved beside them, afterwards.
            events = list(held)
            if not (
                resumed is not None and resumed.task_has(task.task_id, EventType.TASK_COMPLETED)
            ):
                events += self._worker_completed(
                    run, task, result, disclosure, time.monotonic() - started
                )
            if defer_end is not None:
                defer_end.ended = EndedTask(task, tuple(events))
                defer_end.tail = []
                return
            if events:
                await self._append(run.run_id, events, execution.holder)
            if task.reasoning is not None:  # fenced as its appends are (ADR 0094)
                await self.store.save_task(task, held_by=execution.holder)

        await steps.effect(f"{task.task_id}: end", end)
        return result

    async def _task_aborted(
        self,
        run: RunRecord,
        task: TaskRecord,
        failure: tuple[str, str | None],
        resumed: ResumeLog | None,
        held: Sequence[NewEvent] = (),
        holder: Holder | None = None,
        spent: _Spent | None = None,
    ) -> None:
        """A task whose worker raised still ends (failed, with the error and its detail) before
        the run's terminal event, so no reader waits on a task that will never finish; with
        ``spent``, what its model turns were billed (ADR 0131), and the stand-in of a billed
        turn whose own record was not stored (ADR 0131, amended).
        ``holder``: the execution, as its appends name it (ADR 0090)."""
        error, detail = failure[0], kept_detail(run.chain_of_thought, failure[1])
        task.status = "failed"  # in the index with task.completed (ADR 0020)
        task.error = error
        usage = Usage() if spent is None else spent.of(task.task_id)
        billed = usage if usage != Usage() else None
        if billed is not None:
            task.usage = billed.to_dict()
        if resumed is not None and resumed.task_has(task.task_id, EventType.TASK_COMPLETED):
            return
        payload: TaskCompletedPayload = {"status": "failed", "output": None, "error": error}
        if detail:
            payload["error_detail"] = detail
        if billed is not None:
            payload["usage"] = token_usage(billed)
        done = NewEvent(EventType.TASK_COMPLETED, payload, task_id=task.task_id)
        stand_ins = (
            [] if spent is None else await self._stand_ins(run.run_id, spent, held, task.task_id)
        )
        await self._append(run.run_id, [*held, *stand_ins, done], holder)
        if spent is not None:
            spent.unrecorded.pop(task.task_id, None)  # recorded now, its own or its stand-in

    def _worker_completed(
        self,
        run: RunRecord,
        task: TaskRecord,
        result: LoopResult,
        disclosure: Disclosure,
        duration: float,
    ) -> list[NewEvent]:
        """A task's closing events: ``worker.completed`` (what it cost), ``task.completed``."""
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
            blocks = (b for t in result.turn_records for b in t.continuity)
            payload["trace"] = trace_metadata(result.reasoning, blocks)
        done: TaskCompletedPayload = {
            "status": result.status,
            "output": result.answer,
            "error": result.error,
        }
        if result.error_detail and disclosure.in_trace:  # recorded where reasoning is
            done["error_detail"] = result.error_detail
        return [
            NewEvent(EventType.WORKER_COMPLETED, payload, task_id=task.task_id),
            NewEvent(EventType.TASK_COMPLETED, done, task_id=task.task_id),
        ]

    async def _inline(
        self, spec: TaskSpec, task: TaskRecord, recorder: EventRecorder, mode: str
    ) -> LoopResult:
        worker = self.inline_workers[spec.worker or "default"]
        try:
            value = worker(task.prompt)
            output = await value if inspect.isawaitable(value) else value
        except Exception as exc:
            # The worker is user code, whatever it raises: its words are developer-only (ADR 0071).
            error = f"the inline worker raised {type(exc).__name__}"
            detail = kept_detail(mode, exception_line(exc))
            cut: MessagePartiallyCompletedPayload = {
                "text": "",
                "reason": "worker_error",
                "error": error,
            }
            if detail:
                cut["error_detail"] = detail
            await recorder.emit(
                NewEvent(EventType.MESSAGE_PARTIALLY_COMPLETED, cut, task_id=task.task_id)
            )
            return LoopResult(
                "failed",
                "",
                0,
                Usage(),
                "",
                "error",
                error,
                error_type=type(exc).__name__,
                error_detail=detail,
            )
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

    def _observer(
        self, run: RunRecord, spec: TaskSpec, disclosure: Disclosure
    ) -> LoopObserver | None:
        if self.observer_factory is not None:
            return self.observer_factory(run, disclosure)
        return self._visible_reasoning(run, spec, disclosure)

    async def _provider(
        self,
        run: RunRecord,
        spec: TaskSpec,
        task: TaskRecord,
        recorder: EventRecorder,
        disclosure: Disclosure,
        observer: LoopObserver | None,
        execution: _Execution,
        spent: _Spent,
    ) -> LoopResult:
        model = task.model or run.model
        assert model is not None
        provider = self._prepared.get(run.run_id, {}).pop(model, None) or self.provider_factory(
            model
        )
        try:
            return await run_agent_loop(
                provider,
                [*spec.history, Message.user(task.prompt)],
                recorder=recorder,
                task_id=task.task_id,
                disclosure=disclosure,
                tools=execution.tools,
                approvals=self.approvals,
                max_turns=self.config.orchestration.max_turns,
                approval_timeout=self.config.orchestration.approval_timeout_s,
                system=spec.system,
                observer=observer,
                steps=execution.steps,
                billed=spent.biller(task.task_id),
            )
        finally:
            await provider.aclose()


def _loop_result_json(result: LoopResult) -> dict[str, Any]:
    """An inline task's result for its checkpoint (inline workers make no model turns)."""
    return {
        "status": result.status,
        "answer": result.answer,
        "turns": result.turns,
        "usage": result.usage.to_dict(),
        "reasoning": result.reasoning,
        "finish_reason": result.finish_reason,
        "error": result.error,
        "error_type": result.error_type,
        "error_detail": result.error_detail,
    }


def _loop_result_from_json(data: Mapping[str, Any]) -> LoopResult:
    return LoopResult(
        data["status"],
        str(data["answer"]),
        int(data["turns"]),
        Usage.from_dict(data.get("usage") or {}),
        str(data.get("reasoning", "")),
        data.get("finish_reason"),
        data.get("error"),
        error_type=data.get("error_type"),
        error_detail=data.get("error_detail"),  # absent in checkpoints written before
    )


_LOOP_RESULT = StepCodec(_loop_result_json, _loop_result_from_json)


class _DurableSteps:
    """Builds the engine's checkpointed steps without importing DBOS here."""

    @staticmethod
    def of(resumed: ResumeLog | None, mode: str, *, unwritten: bool = False) -> Steps:
        """``mode``: the run's, which decides whether a step's failure keeps its words."""
        from thoughtgate.orchestration.durable import DbosSteps, UnwrittenSteps

        kind = UnwrittenSteps if unwritten else DbosSteps
        return kind(resumed, mode=mode)


@dataclass(frozen=True, slots=True)
class _Execution:
    """What one execution of a run works from: its task specs and tools (both from its stored
    spec) and how its steps are run (directly, or checkpointed by the durable engine)."""

    specs: Sequence[TaskSpec]
    tools: ToolRegistry
    steps: Steps
    holder: Holder
    """The execution, as the run's end names it (ADR 0072)."""
    waits_out_outages: bool = False
    """A durable execution's: a store outage stops it with nothing recorded of it, and it
    continues once the store answers (ADR 0152), instead of failing the task and the run."""

    def last_task(self) -> _Execution:
        """The run's last task's: its final model turn ends the execution (``Steps.last_task``)."""
        return dataclasses.replace(self, steps=self.steps.last_task())

    def waits_out(self, exc: BaseException) -> bool:
        """Whether ``exc`` stops this execution to wait for its store (ADR 0152)."""
        return self.waits_out_outages and store_outage(exc) is not None


@dataclass(slots=True)
class _Spent:
    """What an execution of a run was billed so far: every model turn that returned, of every
    task (finished, failed or cut), a turn replayed from its checkpoint included (ADR 0131).
    The run's end records it, however the run ends."""

    tasks: dict[str, Usage] = field(default_factory=dict)
    """By task id: what each task's turns were billed (a task that failed or was cut records it
    as its own); the run's is their sum (:attr:`usage`)."""
    unrecorded: dict[str, NewEvent] = field(default_factory=dict)
    """By task id: the stand-in ``agent.response`` of its last billed turn while that turn's own
    record is not known to be stored (``Billing``): whoever ends the task records it unless the
    log has the turn's own (:meth:`Runtime._stand_ins`), so the log says what was billed."""
    ended: EndedTask | None = None
    """The last task's end, when it is stored with the run's (``Runtime._execute_task``)."""
    tail: list[NewEvent] = field(default_factory=list)
    """The last task's last events (its last turn's record), held for the run's ending, until
    its end (``ended``) carries them."""

    def biller(self, task_id: str) -> _TaskBilling:
        """``run_agent_loop``'s ``billed`` for the task."""
        return _TaskBilling(self, task_id)

    @property
    def usage(self) -> Usage:
        """What the execution was billed, all tasks together."""
        return sum(self.tasks.values(), Usage())

    def bill(self, usage: Usage, task_id: str) -> None:
        """A model turn of task ``task_id`` returned, with what its provider reported."""
        self.tasks[task_id] = self.tasks.get(task_id, Usage()) + usage

    def of(self, task_id: str) -> Usage:
        """What task ``task_id``'s turns were billed in this execution."""
        return self.tasks.get(task_id, Usage())

    def by_task(self) -> dict[str, dict[str, int]]:
        return {task_id: usage.to_dict() for task_id, usage in self.tasks.items()}

    def held(self) -> list[NewEvent]:
        """The events held for the run's ending: :attr:`tail` and the last task's end's."""
        return [*self.tail, *(() if self.ended is None else self.ended.events)]


@dataclass(frozen=True, slots=True)
class _TaskBilling:
    """One task's ``Billing``: its turns added to the execution's :class:`_Spent`."""

    spent: _Spent
    task_id: str

    def billed(self, usage: Usage, unrecorded: NewEvent) -> None:
        self.spent.bill(usage, self.task_id)
        self.spent.unrecorded[self.task_id] = unrecorded

    def recorded(self) -> None:
        self.spent.unrecorded.pop(self.task_id, None)


async def _close_all(providers: Iterable[Provider]) -> None:
    for provider in providers:
        with contextlib.suppress(Exception):
            await provider.aclose()


def _run_status(task_statuses: Sequence[str]) -> RunStatus:
    """All tasks answered: completed; any task without an answer: failed; else partial."""
    if all(s == "completed" for s in task_statuses):
        return "completed"
    if any(s == "failed" for s in task_statuses):
        return "failed"
    return "partial"


def _cancel_reason(exc: asyncio.CancelledError) -> str:
    """The message the canceller gave (``task.cancel(msg)``), else a plain description."""
    if exc.args and isinstance(exc.args[0], str) and exc.args[0]:
        return exc.args[0]
    return "it was cancelled before it finished"


def _error_type(exc: Exception) -> str:
    """A provider's error code, else the error's class (``engine.loop.error_type_of``); a
    replayed step's, the class it stands in for (``errors.failure_kind``, ADR 0079)."""
    return error_type_of(exc) if isinstance(exc, ProviderError) else failure_kind(exc)


def _describe_task(opened: TaskStartedPayload, spec: TaskSpec, tools: Sequence[ToolSpec]) -> None:
    """What the model of a provider task is given besides its prompt, for the trace surface and
    telemetry (``system``, ``tools``, ``history``; never a display surface)."""
    if spec.system:
        opened["system"] = spec.system
    if tools:
        definitions: list[ToolDefinitionPayload] = [
            {
                "type": "function",
                "name": t.name,
                "description": t.description,
                "parameters": dict(t.parameters),
            }
            for t in tools
        ]
        opened["tools"] = definitions
    if spec.history:
        opened["history"] = history_payload(spec.history)


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
