"""The driven-loop contract every engine loop follows.

A loop never runs itself: the scheduler asks it for its next unit of work (``next``), runs that work
on a device worker (possibly batched with other sessions' work of the same shape), then feeds the
result back (``advance``). Because control returns to the scheduler between every two steps, any
request can be cancelled there, and work from many requests can be interleaved and batched.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from .messages import Chunk, End
from .requests import EngineRequest

StateT = TypeVar("StateT")
StateT_contra = TypeVar("StateT_contra", contravariant=True)  # Releasing only takes a state
RequestT_contra = TypeVar("RequestT_contra", bound=EngineRequest, contravariant=True)


@dataclass(frozen=True)
class ShapeSignature:
    """Work units with equal signatures may run in one batched device call."""

    kind: str
    dims: tuple[int, ...] = ()


@dataclass
class StepResult:
    """A step's output for ``advance`` plus the stream chunks it produced for the client."""

    output: Any = None
    chunks: list[Chunk] = field(default_factory=list)
    media_seconds: float = 0.0  # playable media the chunks carry: drives deadline-first ordering


@dataclass
class WorkPlan:
    """One schedulable unit of work.

    ``run`` computes the step alone; ``batch_run`` (shared by all plans of one shape signature)
    computes several plans' steps in one call and returns one ``StepResult`` per plan, in order.
    ``batch_run`` must be all or nothing: when it raises, no plan's state may have changed,
    because the scheduler then runs each plan alone to find the one that fails and ends only
    its request.
    ``emits`` names the client streams the step feeds, so the scheduler can favour steps the
    listener is waiting for. ``due`` says when the step's output is needed, as a position (seconds)
    on the request's media timeline: a vocoder chunk is due where the audio sent so far ends; the
    talker's next sentence is due where the audio already synthesized ends. ``None``: due now.
    ``long``: the step holds its worker for hundreds of milliseconds (a Whisper segment); while a
    stream is playing, long steps get at most all workers but one, so the stream always has one.
    """

    kind: str
    shape: ShapeSignature
    run: Callable[[], StepResult]
    emits: tuple[str, ...] = ()
    payload: Any = None
    batch_run: Callable[[Sequence[WorkPlan]], list[StepResult]] | None = None
    label: str = ""
    due: float | None = None
    long: bool = False


class Done:
    """Returned by ``next`` when the loop has nothing left to do."""

    __slots__ = ()


class Waiting:
    """Returned by ``next`` when the loop waits for an upstream loop of the same request."""

    __slots__ = ()


Wake = Callable[[], None]


@dataclass(frozen=True)
class WaitFor:
    """Returned by ``next`` when the loop waits on something outside the engine (an HTTP stream).

    The scheduler calls ``subscribe(wake)`` once and steps nothing of the loop until ``wake()``
    is called, from any thread, when the loop has work again; no worker is held meanwhile.
    ``subscribe`` must call ``wake`` itself (at once) when the loop is already ready, so that
    nothing that arrived before the subscription is missed, and must not block.
    """

    subscribe: Callable[[Wake], None]


DONE = Done()
WAITING = Waiting()


class Loop(Protocol, Generic[RequestT_contra, StateT]):
    """init(request, slots) → state; next(state) → plan | DONE | WAITING | WaitFor; advance; finalize.

    Typed by the request it serves (``SpeakRequest``, ``TranscribeRequest``, ...) and its state.

    ``slots`` is one dict per request shared by that request's loops: how an upstream loop (the
    talker) hands its output to a downstream one (the vocoder). ``next`` and ``advance`` run under
    the scheduler's lock and must stay cheap; the device work belongs in ``WorkPlan.run``.
    """

    name: str

    def init(self, request: RequestT_contra, slots: dict[str, Any]) -> StateT: ...

    def next(self, state: StateT) -> WorkPlan | Done | Waiting | WaitFor: ...

    def advance(self, state: StateT, result: StepResult) -> None: ...

    def finalize(self, state: StateT) -> dict[str, Any]: ...


class Releasing(Protocol[StateT_contra]):
    """Optional on a loop: ``release(state)`` frees what a state holds outside the process (an HTTP
    stream) when its request ends without ``finalize`` (aborted, failed, engine stopped).

    Called once, without the scheduler's lock, possibly while a step of the request is still
    running on another thread, so it must be thread-safe and quick.
    """

    def release(self, state: StateT_contra) -> None: ...


class Pipeline(Protocol):
    """The loops that serve one kind of request (e.g. talker → vocoder), in cascade order.

    A pipeline may set ``shed = False``: its requests are then admitted by the counts alone, never
    refused by load shedding (the VAD windows of a session that is already listening).
    """

    # Read-only for the engine: a pipeline may hold them as plain attributes (a tuple of its own loops).
    @property
    def name(self) -> str: ...

    @property
    def loops(self) -> Sequence[Loop[Any, Any]]: ...

    def validate(self, request: EngineRequest) -> None:
        """Raise ``ValueError`` with a client-safe message when the request cannot be served (not
        this pipeline's request type, a value out of range)."""
        ...

    def finish(self, finals: list[dict[str, Any]]) -> End:
        """Fold the loops' finalize results into the request's ``End`` (``Status.OK``, or a
        failure the loops recorded, e.g. the upstream thinker's)."""
        ...
