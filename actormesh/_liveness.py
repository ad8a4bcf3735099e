"""Liveness: what one actor of a mesh is (alive, restarting, dead), and the one function that
changes it. Pure logic, no Ray and no threads: `_failures` feeds it every event and carries out
what it answers, and tests/test_liveness.py drives it directly.

    alive --(restarting notice, or a call found it gone)--> restarting
    restarting --(alive notice of a new incarnation)--> returning --(its hook ended)--> alive
    restarting --(alive notice of the same incarnation: the loss was transient)--> alive
    restarting --(restart_timeout_s passed)--> gone --(alive notice)--> returning | alive
    any --(dead notice)--> dead   (Ray restarts it no more: final)

Ray numbers an actor's incarnations (its restart count, the *epoch*) and publishes, per epoch,
"restarting" and then "alive"; a notice older than one already seen is stale and ignored, so a
late answer never undoes a newer fact. `routed` is the incarnation `choose` may route to: an
actor is admitted again only from "returning" with the matching epoch and only if nothing said
it went away since (a death during its hook keeps it out). The restart timer stops once the
actor is back; the hook is bounded by a limit of its own (`_failures`).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Literal


class Status(enum.Enum):
    ALIVE = "alive"  # routed to
    RESTARTING = "restarting"  # gone, Ray restarts it: calls that only it can serve wait
    RETURNING = "returning"  # a new incarnation answers; its `on_restart` hook runs first
    GONE = "gone"  # did not come back within restart_timeout_s: its calls failed
    DEAD = "dead"  # Ray will not restart it


Seen = Literal["restarting", "alive", "dead"]
"""An actor state as Ray's GCS reports it."""

_ORDER = {"restarting": 0, "alive": 1, "dead": 2}  # within one epoch, what Ray publishes first


@dataclasses.dataclass(frozen=True)
class Life:
    """One actor's liveness. Immutable: other threads may read it while the loop replaces it."""

    status: Status = Status.ALIVE
    epoch: int = 0  # the newest incarnation seen
    seen: Seen = "alive"  # what the newest notice said of it
    routed: int = 0  # the incarnation `choose` routes to (the last one admitted)
    timer: int = 0  # the running restart timer's token; 0: none
    suspect: bool = False  # returning, but a call to it was lost: admit once a read says alive
    back: bool = False  # returning, and its hook has ended


# -- events -----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Notice:
    """Ray's GCS says the actor is `state` in incarnation `epoch` (a channel notice, or the
    answer to a state read)."""

    state: Seen
    epoch: int
    reason: str = ""


@dataclasses.dataclass(frozen=True)
class Lost:
    """A call sent to incarnation `epoch` found the actor gone (or unreachable)."""

    epoch: int


@dataclasses.dataclass(frozen=True)
class HookEnded:
    """The come-back of incarnation `epoch` is over: its hook returned, raised or overran."""

    epoch: int


@dataclasses.dataclass(frozen=True)
class TimerFired:
    """The restart timer with this token ran out (`why` says how long it was)."""

    token: int
    why: str = "did not come back in time"


Event = Notice | Lost | HookEnded | TimerFired


# -- what the caller must do ------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Route:
    """Make the scheduler see the actor as `as_`: take calls ("alive"), take none but keep calls
    only it can serve waiting ("restarting"), or fail those ("dead", with `why`)."""

    as_: Literal["alive", "restarting", "dead"]
    why: str = ""


@dataclasses.dataclass(frozen=True)
class StartTimer:
    token: int


@dataclasses.dataclass(frozen=True)
class StopTimer:
    pass


@dataclasses.dataclass(frozen=True)
class Probe:
    """Read the actor's state from the GCS (retried until it answers); the answer is a
    `Notice`."""


@dataclasses.dataclass(frozen=True)
class ComeBack:
    """Incarnation `epoch` answers: once this process can call it, run the hook, then send
    `HookEnded(epoch)`."""

    epoch: int


Effect = Route | StartTimer | StopTimer | Probe | ComeBack

_ROUTED_AS: dict[Status, Literal["alive", "restarting", "dead"]] = {
    Status.ALIVE: "alive", Status.RESTARTING: "restarting", Status.RETURNING: "restarting",
    Status.GONE: "dead", Status.DEAD: "dead",
}


def routed_as(life: Life) -> Literal["alive", "restarting", "dead"]:
    """How the scheduler should see an actor in this state."""
    return _ROUTED_AS[life.status]


def transition(life: Life, event: Event, *, timer: int) -> tuple[Life, list[Effect]]:
    """The next state of an actor and what to do about it. `timer` is the token a restart
    timer started now would get (the caller's counter, unique per mesh)."""
    if isinstance(event, Notice):
        return _notice(life, event, timer)
    if isinstance(event, Lost):
        return _lost(life, event, timer)
    if isinstance(event, HookEnded):
        if life.status is Status.RETURNING and event.epoch == life.epoch and not life.back:
            if life.suspect:
                return dataclasses.replace(life, back=True), []
            return _admit(life)
        return life, []
    if event.token == life.timer and life.status is Status.RESTARTING:
        return dataclasses.replace(life, status=Status.GONE, timer=0), [Route("dead", event.why)]
    return life, []


def _notice(life: Life, notice: Notice, timer: int) -> tuple[Life, list[Effect]]:
    if life.status is Status.DEAD:
        return life, []
    if notice.state == "dead":
        why = "died" + (f": {notice.reason}" if notice.reason else "")
        effects: list[Effect] = [StopTimer()] if life.timer else []
        return (dataclasses.replace(life, status=Status.DEAD, epoch=max(life.epoch, notice.epoch),
                                    seen="dead", timer=0),
                [*effects, Route("dead", why)])
    position = (notice.epoch, _ORDER[notice.state])
    if position < (life.epoch, _ORDER[life.seen]):
        return life, []  # older than what is known: a late answer
    newer = dataclasses.replace(life, epoch=notice.epoch, seen=notice.state)
    if notice.state == "restarting":
        if life.status in (Status.ALIVE, Status.RETURNING):
            return _restarting(newer, timer)
        return newer, []  # restarting (its timer runs) or gone (a later "alive" revives it)
    # "alive"
    if notice.epoch > life.routed:  # a new incarnation
        if life.status is Status.RETURNING and notice.epoch == life.epoch:
            if life.suspect:  # a read after a lost call: it is fine after all
                cleared = dataclasses.replace(newer, suspect=False)
                return _admit(cleared) if life.back else (cleared, [])
            return newer, []
        effects = [StopTimer()] if life.timer else []
        returning = dataclasses.replace(newer, status=Status.RETURNING, timer=0, suspect=False,
                                        back=False)
        return returning, [*effects, Route("restarting"), ComeBack(notice.epoch)]
    if life.status in (Status.RESTARTING, Status.GONE):  # the routed incarnation answers
        return _admit(newer)
    return newer, []


def _lost(life: Life, lost: Lost, timer: int) -> tuple[Life, list[Effect]]:
    # Every answer restates how the scheduler should see the actor: the completion thread marks
    # an actor it finds gone at once, before this event comes, and that mark may have hit an
    # incarnation admitted meanwhile (then it is undone here).
    keep: list[Effect] = [Route(routed_as(life))]
    if life.status is Status.ALIVE and lost.epoch == life.routed:
        suspected, effects = _restarting(life, timer)
        return suspected, [*effects, Probe()]
    if life.status is Status.RETURNING and lost.epoch == life.epoch and not life.suspect:
        return dataclasses.replace(life, suspect=True), [*keep, Probe()]
    return life, keep


def _restarting(life: Life, timer: int) -> tuple[Life, list[Effect]]:
    return (dataclasses.replace(life, status=Status.RESTARTING, timer=timer, suspect=False,
                                back=False),
            [Route("restarting"), StartTimer(timer)])


def _admit(life: Life) -> tuple[Life, list[Effect]]:
    effects: list[Effect] = [StopTimer()] if life.timer else []
    return (dataclasses.replace(life, status=Status.ALIVE, routed=life.epoch, timer=0,
                                suspect=False, back=False),
            [*effects, Route("alive")])
