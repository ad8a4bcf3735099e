"""The liveness state machine alone (`_liveness.transition`): no Ray, no threads, no clock. One
test per transition, then the interleavings that once put a dead actor back into rotation or
gave up on one that was fine (issue 25, findings 3, 4, 8 and 9)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from actormesh._liveness import (
    ComeBack,
    Effect,
    Event,
    HookEnded,
    Life,
    Lost,
    Notice,
    Probe,
    Route,
    StartTimer,
    Status,
    StopTimer,
    TimerFired,
    routed_as,
    transition,
)

TIMER = 7  # the token the next restart timer gets


def run(life: Life, *events: Event) -> tuple[Life, list[Effect]]:
    """Feed events in order; the state after the last and every effect on the way."""
    effects: list[Effect] = []
    for event in events:
        life, more = transition(life, event, timer=TIMER)
        effects += more
    return life, effects


def restarting(epoch: int = 1) -> Life:
    """An actor whose first incarnation went away: Ray restarts it as `epoch`."""
    life, _ = run(Life(), Notice("restarting", epoch))
    return life


def returning(epoch: int = 1) -> Life:
    """A new incarnation that answers and runs its hook."""
    life, _ = run(restarting(epoch), Notice("alive", epoch))
    return life


def routes(effects: Sequence[Effect]) -> list[str]:
    return [e.as_ for e in effects if isinstance(e, Route)]


# -- one transition each ----------------------------------------------------------------------
def test_a_restarting_notice_stops_routing_and_starts_the_restart_timer() -> None:
    life, effects = run(Life(), Notice("restarting", 1))
    assert (life.status, life.epoch, life.routed, life.timer) == (Status.RESTARTING, 1, 0, TIMER)
    assert effects == [Route("restarting"), StartTimer(TIMER)]


def test_a_new_incarnation_that_answers_returns_stops_the_timer_and_comes_back() -> None:
    life, effects = run(restarting(1), Notice("alive", 1))
    assert (life.status, life.epoch, life.routed, life.timer) == (Status.RETURNING, 1, 0, 0)
    assert effects == [StopTimer(), Route("restarting"), ComeBack(1)]


def test_a_restart_too_quick_to_be_published_still_runs_the_hook() -> None:
    life, effects = run(Life(), Notice("alive", 1))
    assert life.status is Status.RETURNING
    assert effects == [Route("restarting"), ComeBack(1)]


def test_the_end_of_its_hook_admits_the_returning_incarnation() -> None:
    life, effects = run(returning(1), HookEnded(1))
    assert (life.status, life.routed) == (Status.ALIVE, 1)
    assert effects == [Route("alive")]


def test_a_dead_notice_is_final() -> None:
    life, effects = run(Life(), Notice("dead", 0, "killed"))
    assert life.status is Status.DEAD
    assert effects == [Route("dead", "died: killed")]
    assert run(life, Notice("alive", 3), Notice("restarting", 4), Lost(0), HookEnded(3))[0] == life


def test_the_restart_timer_gives_up_on_an_actor_that_does_not_come_back() -> None:
    life, effects = run(restarting(1), TimerFired(TIMER, "did not come back in 1 s"))
    assert life.status is Status.GONE
    assert effects == [Route("dead", "did not come back in 1 s")]


def test_an_actor_given_up_on_is_admitted_again_when_it_does_come_back() -> None:
    gone, _ = run(restarting(1), TimerFired(TIMER))
    life, effects = run(gone, Notice("alive", 1))
    assert life.status is Status.RETURNING and ComeBack(1) in effects
    assert run(life, HookEnded(1))[0].status is Status.ALIVE


def test_a_lost_call_makes_the_actor_suspect_and_its_state_is_read() -> None:
    life, effects = run(Life(), Lost(0))
    assert (life.status, life.timer) == (Status.RESTARTING, TIMER)
    assert effects == [Route("restarting"), StartTimer(TIMER), Probe()]


def test_a_read_saying_the_same_incarnation_is_alive_admits_it_without_a_hook() -> None:
    suspect, _ = run(Life(), Lost(0))
    life, effects = run(suspect, Notice("alive", 0))
    assert (life.status, life.routed) == (Status.ALIVE, 0)
    assert effects == [StopTimer(), Route("alive")]


def test_a_call_lost_by_an_earlier_incarnation_changes_nothing_but_restates_the_routing() -> None:
    alive, _ = run(returning(2), HookEnded(2))
    life, effects = run(alive, Lost(1))
    assert life == alive
    assert effects == [Route("alive")]


def test_a_call_lost_by_the_returning_incarnation_holds_its_admission_until_a_read() -> None:
    life, effects = run(returning(1), Lost(1))
    assert life.suspect and effects == [Route("restarting"), Probe()]
    life, effects = run(life, HookEnded(1))
    assert (life.status, life.back, effects) == (Status.RETURNING, True, [])
    life, effects = run(life, Notice("alive", 1))
    assert (life.status, life.routed) == (Status.ALIVE, 1)
    assert effects == [Route("alive")]


def test_a_read_after_a_lost_call_may_find_the_actor_restarting_again() -> None:
    life, _ = run(returning(1), Lost(1), HookEnded(1), Notice("restarting", 2))
    assert (life.status, life.epoch, life.routed) == (Status.RESTARTING, 2, 0)


@pytest.mark.parametrize("late", [Notice("restarting", 1), Notice("alive", 0),
                                  Notice("restarting", 0)])
def test_a_notice_older_than_what_is_known_is_ignored(late: Notice) -> None:
    life = returning(1)
    assert run(life, late) == (life, [])


def test_a_timer_of_an_earlier_restart_is_ignored() -> None:
    life = returning(1)
    assert run(life, TimerFired(TIMER)) == (life, [])
    assert run(restarting(1), TimerFired(TIMER + 1))[0].status is Status.RESTARTING


def test_the_hook_end_of_another_incarnation_is_ignored() -> None:
    life = returning(2)
    assert run(life, HookEnded(1)) == (life, [])


@pytest.mark.parametrize(("status", "routed"), [
    (Status.ALIVE, "alive"), (Status.RESTARTING, "restarting"), (Status.RETURNING, "restarting"),
    (Status.GONE, "dead"), (Status.DEAD, "dead"),
])
def test_each_status_is_routed_as_the_scheduler_knows_it(status: Status, routed: str) -> None:
    assert routed_as(Life(status=status)) == routed


# -- the interleavings of issue 25 ------------------------------------------------------------
def test_an_actor_killed_for_good_during_its_hook_is_not_admitted_when_the_hook_ends() -> None:
    """Finding 3: re-admission checked only the epoch, so the hook's end put a dead actor
    back."""
    life, effects = run(returning(1), Notice("dead", 1, "killed"), HookEnded(1))
    assert life.status is Status.DEAD
    assert routes(effects) == ["dead"]


def test_an_actor_restarting_again_during_its_hook_is_not_admitted_by_the_old_hook() -> None:
    life, effects = run(returning(1), Notice("restarting", 2), HookEnded(1))
    assert life.status is Status.RESTARTING and "alive" not in routes(effects)


def test_the_restart_timer_stops_when_the_actor_is_back_however_long_its_hook_runs() -> None:
    """Finding 4: the timer counted the hook's run time and gave up on an actor that was
    back."""
    life, effects = run(restarting(1), Notice("alive", 1), TimerFired(TIMER))
    assert life.status is Status.RETURNING and StopTimer() in effects
    assert "dead" not in routes(effects)
    assert run(life, HookEnded(1))[0].status is Status.ALIVE


def test_a_transient_loss_with_an_unanswered_read_is_not_a_death() -> None:
    """Finding 8: a lost call whose first state read failed ended, at the timer, in a death
    for good. The timer may give up; the read goes on, and its answer admits the actor."""
    suspect, _ = run(Life(), Lost(0))
    gone, effects = run(suspect, TimerFired(TIMER))
    assert gone.status is Status.GONE
    life, effects = run(gone, Notice("alive", 0))
    assert (life.status, routes(effects)) == (Status.ALIVE, ["alive"])


def test_a_loss_found_on_an_incarnation_admitted_meanwhile_restates_it_alive() -> None:
    """Finding 9: the completion thread saw incarnation 0 alive and marked the actor gone, but
    the loop had admitted incarnation 1 in between; the loss event undoes that mark."""
    admitted, _ = run(Life(), Notice("restarting", 1), Notice("alive", 1), HookEnded(1))
    life, effects = run(admitted, Lost(0))
    assert life == admitted
    assert routes(effects) == ["alive"]
