"""Hedged calls: a second copy of a call that is late, on another actor; the first VALUE wins.

    choose(...) with .options(hedge=True | s)  the call goes alone (a task of its own: cancelling
                                               one copy must not touch other calls)
      Router.send_task -> Hedges.arm(call)     a timer on the loop thread, `delay` after the send
      ... the timer fires, the call still runs: late if `delay` has passed since it began (over
      actors that run calls in order, a call sent behind another begins when that one ends)
      Hedges._try(call)                        it runs alone on its actor (over in-order actors:
                                               a call still waiting there is never hedged), a
                                               token of the budget, and the native scheduler's
                                               pick (Scheduler.hedge): another actor of the view
                                               with a free slot, an idle one over in-order
                                               actors; none: the call stays due and the next
                                               slot that frees is tried
        Router.send_copy(target, call)         the copy: its own task and slot, the call's future
                                               shared
      ... Router.end of either copy            which copy wins: the first to end with a VALUE.
                                               A copy that raised, or was lost with its actor,
                                               never wins while the other still runs (a fast
                                               failure must not beat a slower success); when
                                               both fail, the last to end gives the error (or a
                                               retry, with `retries`). The loser is cancelled
                                               (`Router.cancel_sent`: an async or threaded
                                               actor stops it, one not yet started never runs;
                                               a synchronous one runs it to its end); each copy
                                               frees its own slot when its own task ends

So over actors that run calls in order, both copies of a hedged call are each running or on
their way to an idle actor: no copy that may lose ever waits in such an actor's queue, where it
could not be cancelled.

The delay is the `hedge=` number, or learnt: the 95th percentile of the method's latest service
times on this mesh (`Scheduler.method_quantile_s`, start-up left out); until 8 are known the call
looks again after 5 ms, then at doubling intervals up to 1 s. The budget is a token bucket per
mesh: each hedge-enabled call earns BUDGET of a token, at most BURST are kept, and a copy spends
one; a call that finds the bucket empty is not hedged.
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from typing import TYPE_CHECKING

from . import _loop

if TYPE_CHECKING:
    from ._calls import Call, Router

LEARNT = math.inf
"""`Call.hedge` of a call whose delay is learnt (`hedge=True`)."""
QUANTILE = 0.95
BUDGET = 0.05
"""Copies per hedge-enabled call, in the long run: at most one call in twenty is hedged."""
BURST = 5.0
"""Copies the budget holds at most (and holds at first): a burst of late calls is hedged at once."""
_PROBE_S = 0.005  # while no delay is learnt, a call looks again after this long (doubling)
_PROBE_MAX_S = 1.0
_PRUNE_MIN = 64


def check(hedge: object) -> float | None:
    """The `hedge=` option as `Call.hedge`: None (off: None or False), LEARNT (True), or a
    delay in seconds (a finite number > 0); a clear error for anything else."""
    if hedge is None or hedge is False:
        return None
    if hedge is True:
        return LEARNT
    if not isinstance(hedge, (int, float)):
        raise TypeError(f"hedge={hedge!r}: must be True (a learnt delay), a number of seconds, "
                        "or None")
    if not math.isfinite(hedge) or hedge <= 0:
        raise ValueError(f"hedge={hedge!r}: must be a finite number of seconds > 0, or True")
    return float(hedge)


class Budget:
    """A token bucket: hedge-enabled calls earn tokens, copies spend them."""

    __slots__ = ("_lock", "_tokens")

    def __init__(self) -> None:
        self._lock = threading.Lock()  # held for a few bytecodes: senders earn on any thread
        self._tokens = BURST

    def earn(self) -> None:
        with self._lock:
            self._tokens = min(BURST, self._tokens + BUDGET)

    def has(self) -> bool:
        return self._tokens >= 1.0

    def spend(self) -> None:
        """Take a token (there is one: only the loop thread spends, after `has`)."""
        with self._lock:
            self._tokens -= 1.0


class Hedges:
    """The hedged calls of one mesh (its router): their timers, the calls due for a copy, the
    budget. Every method but `arm` and `retry_soon` runs on the loop thread (`due` is read anywhere)."""

    def __init__(self, router: Router, *, in_order: bool) -> None:
        self._router = router
        # The actors run calls in order: a call may wait in one behind another, and a copy goes
        # only to an idle actor.
        self._in_order = in_order
        self.budget = Budget()
        # Calls late (or possibly late: still waiting in their actor) that found no actor free
        # for a copy, oldest first; each leaves when it is hedged, found not late, or ends.
        # Written on the loop thread, read anywhere.
        self.due: dict[Call, None] = {}
        self._prune_at = _PRUNE_MIN  # the size of `due` at which ended calls are dropped
        self._retry_posted = False

    def arm(self, call: Call) -> None:
        """A hedge-enabled call was sent (any thread): look again once it may be late. The
        timer holds the call weakly: an ended call that nobody holds goes at once."""
        self.budget.earn()
        delay = self._delay(call)
        _loop.call_later(_PROBE_S if delay is None else delay, self._late, weakref.ref(call),
                         _PROBE_S)

    def retry_soon(self) -> None:
        """A slot has freed (Ray's completion thread): the calls due for a copy try it, once,
        on the loop thread."""
        if self._retry_posted:
            return
        self._retry_posted = True
        _loop.post(self._retry)

    def _delay(self, call: Call) -> float | None:
        """Seconds after it began that `call` is late; None while not learnt."""
        if call.hedge != LEARNT:
            return call.hedge
        learnt = self._router.scheduler.method_quantile_s(call.method_id, QUANTILE)
        return None if math.isnan(learnt) else learnt

    def _began(self, call: Call) -> float:
        """When `call` began to run, as far as the driver can tell: over in-order actors, not
        before the task sent ahead of it to the same actor ended."""
        assert call.task is not None
        if not self._in_order:
            return call.task.started
        return max(call.task.started, self._router.last_end[call.actor])

    def _late(self, ref: weakref.ref[Call], probe_s: float) -> None:
        call = ref()
        if call is None or not _running(call):
            return
        if self._delay(call) is None:  # not learnt yet: look again
            probe_s = min(2 * probe_s, _PROBE_MAX_S)
            _loop.call_later(probe_s, self._late, ref, probe_s)
            return
        self.due[call] = None  # before trying: a slot that frees from now on tries it again
        if len(self.due) > self._prune_at:
            self._prune()
        self._try(call)

    def _prune(self) -> None:
        """Drop the calls that ended while due (while calls wait for slots, no copy is tried and
        the due calls are not visited): an ended call's arguments go with it."""
        for call in [c for c in self.due if not _running(c)]:
            del self.due[call]
            if call.future.done():  # over: no retry, and no copy will be sent
                call.args, call.kwargs = (), {}
        self._prune_at = max(_PRUNE_MIN, 2 * len(self.due))

    def _retry(self) -> None:
        self._retry_posted = False
        for call in list(self.due):
            if not self._try(call):
                return  # no actor free for this one: none for those after it either

    def _try(self, call: Call) -> bool:
        """Send the copy of `call` if it still runs alone on its actor, is late, the budget
        allows and an actor is free; False only when no actor is free (the call stays due)."""
        router = self._router
        if not _running(call) or router.closed:
            self.due.pop(call, None)
            return True
        if self._in_order and router.scheduler.tasks()[call.actor] > 1:
            return True  # it may still wait behind another call: tried again as slots free
        delay = self._delay(call)
        left = self._began(call) + (delay or 0.0) - time.perf_counter()
        if left > 0:  # not late yet, counted from when it began
            del self.due[call]
            _loop.call_later(left, self._late, weakref.ref(call), _PROBE_S)
            return True
        if not self.budget.has():
            del self.due[call]
            return True
        assert call.target is not None
        target = router.scheduler.hedge(call.group, call.actor, self._in_order)
        if target < 0:
            return False
        del self.due[call]
        self.budget.spend()
        router.send_copy(target, call)
        return True


def _running(call: Call) -> bool:
    """Sent, not ended, and not hedged yet."""
    task = call.task
    return call.twin is None and task is not None and not task.ended() \
        and not call.future.done()

