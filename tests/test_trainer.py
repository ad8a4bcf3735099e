"""AsyncTrainer: admission, exactly-once, S=0 against sync=True bit for bit, failures, resume.

No Ray and no sleeps: fake rollouts are cooperative (they yield to the event loop a number of
times that depends on their uid, so they finish out of order), and every test is deterministic
in what it asserts whatever the scheduling of the trainer's worker thread.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import torch

from actormesh.integrations.trainer import (
    AsyncTrainer,
    Counters,
    RolloutError,
    StepMetrics,
    epoch_order,
)
from actormesh.integrations.trainer import _rollout as rollout_module

SEED = 7


async def yields(uid: int) -> None:
    """Let the loop run a uid-dependent number of times: a heavy-ish tail of completion order."""
    for _ in range((uid * 37) % 23 + (40 if uid % 9 == 4 else 0)):
        await asyncio.sleep(0)


def is_filtered(uid: int) -> bool:
    return uid % 7 == 3


def expected_batches(num_prompts: int, batch_size: int, epochs: int,
                     filtered: Callable[[int], bool] = is_filtered) -> list[list[int]]:
    """The plain synchronous loop's batches: walk each epoch's permutation, B accepted at a time."""
    batches: list[list[int]] = []
    for epoch in range(epochs):
        batch: list[int] = []
        for uid in epoch_order(num_prompts, SEED, epoch):
            if not filtered(uid):
                batch.append(uid)
            if len(batch) == batch_size:
                batches.append(sorted(batch))
                batch = []
        if batch:
            batches.append(sorted(batch))
    return batches


def no_train_thread() -> bool:
    return not any(t.name.startswith("actormesh-train") for t in threading.enumerate())


class Recorder:
    """A fake generator and trainer: records versions seen, batches trained, every transition."""

    def __init__(self, batch_size: int, max_staleness: int,
                 max_concurrency: int | None = None) -> None:
        self.batch_size, self.max_staleness = batch_size, max_staleness
        self.max_concurrency = max_concurrency
        self.generator_version = 0
        self.returning = False
        self.started_with: dict[int, list[int]] = {}
        self.batches: list[list[int]] = []
        self.transitions: list[Counters] = []

    async def rollout(self, prompt: int, uid: int) -> int | None:
        self.started_with.setdefault(uid, []).append(self.generator_version)
        await yields(uid)
        return None if is_filtered(uid) else prompt

    def train(self, groups: list[int], step: int) -> None:
        assert step == len(self.batches)
        self.batches.append(list(groups))

    async def sync_weights(self, version: int) -> None:
        await asyncio.sleep(0)
        self.generator_version = version
        self.returning = True  # until the loop's "synced" transition

    def check(self, c: Counters) -> None:
        """The admission invariants, at every transition."""
        self.transitions.append(c)
        assert c.submitted == c.running + c.accepted + c.filtered
        assert c.accepted + c.running <= (self.max_staleness + c.epoch_version + 1) * self.batch_size
        assert self.max_concurrency is None or c.running <= self.max_concurrency
        assert 0 <= c.trained <= c.accepted
        # A version counts once its sync returned: the ledger never runs ahead of the generator.
        # Between the end of sync_weights and the loop's "synced", another task's transition
        # may come: it still sees the version before.
        if c.event == "synced":
            self.returning = False
        assert c.version == self.generator_version or (
            self.returning and c.version == self.generator_version - 1)


def make(rec: Recorder, num_prompts: int = 40, *, epochs: int = 2, sync: bool = False,
         train: Callable[[list[int], int], object] | None = None,
         **options: Any) -> AsyncTrainer[int]:
    return AsyncTrainer(list(range(num_prompts)), rec.rollout, train or rec.train,
                        batch_size=rec.batch_size, max_staleness=rec.max_staleness,
                        max_concurrency=rec.max_concurrency, sync_weights=rec.sync_weights,
                        epochs=epochs, seed=SEED, sync=sync, on_transition=rec.check, **options)


# -- exactly once, admission, versions ------------------------------------------------------------
@pytest.mark.parametrize("max_staleness", [0, 1, 2, 4])
@pytest.mark.parametrize("concurrency", [None, 3])
def test_every_prompt_is_trained_exactly_once_per_epoch_in_permutation_batches(
        max_staleness: int, concurrency: int | None) -> None:
    rec = Recorder(batch_size=4, max_staleness=max_staleness, max_concurrency=concurrency)
    metrics = make(rec, 40, epochs=2).run()
    assert rec.batches == expected_batches(40, 4, 2)
    assert [m["uids"] for m in metrics] == rec.batches
    assert [m["step"] for m in metrics] == list(range(len(metrics)))
    for epoch in (0, 1):
        uids = [u for m in metrics if m["epoch"] == epoch for u in m["uids"]]
        assert sorted(uids) == [u for u in range(40) if not is_filtered(u)]
        filtered = [u for m in metrics if m["epoch"] == epoch for u in m["filtered"]]
        assert sorted(filtered) == [u for u in range(40) if is_filtered(u)]
    assert no_train_thread()


@pytest.mark.parametrize("max_staleness", [0, 1, 2, 4])
def test_staleness_is_bounded_and_versions_are_the_weights_each_rollout_saw(
        max_staleness: int) -> None:
    rec = Recorder(batch_size=3, max_staleness=max_staleness)
    metrics = make(rec, 40, epochs=1).run()
    for m in metrics:
        # The version current when the trainer launched the rollout; its body, one turn of the
        # event loop later, may already see the next one (never more).
        seen = [rec.started_with[u][-1] for u in m["uids"]]
        assert all(0 <= s - v <= 1 for s, v in zip(seen, m["versions"]))
        assert m["staleness"] == [m["step"] - v for v in m["versions"]]
        assert all(0 <= s <= max_staleness for s in m["staleness"])
    if max_staleness:
        assert any(s > 0 for m in metrics for s in m["staleness"])  # the loop did run ahead


def test_admission_fills_the_window_of_max_staleness_plus_one_batches() -> None:
    rec = Recorder(batch_size=2, max_staleness=1)
    make(rec, 20, epochs=1).run()
    events = [c.event for c in rec.transitions]
    assert events[0] == "epoch" and events.count("synced") == events.count("trained")
    # Groups in flight or buffered beyond the synced steps: up to (S + 1) * B, never more.
    window = [c.accepted + c.running - 2 * c.epoch_version
              for c in rec.transitions if c.event == "admitted"]
    assert max(window) == (1 + 1) * 2


# -- S=0 is the synchronous loop, bit for bit ---------------------------------------------------
class TorchRL:
    """A tiny policy: rollouts sample with the generator's copy of the weights, seeded by uid;
    a group is filtered when its samples all agree in sign (DAPO-style, weight dependent)."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Linear(4, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05)
        self.generator = {k: v.clone() for k, v in self.model.state_dict().items()}
        self.syncs: list[int] = []

    async def rollout(self, prompt: int, uid: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        weights = self.generator
        await yields(uid)
        g = torch.Generator().manual_seed(SEED * 100_003 + uid)
        x = torch.randn(6, 4, generator=g) + prompt / 10
        y = x @ weights["weight"].T + weights["bias"] + 0.3 * torch.randn(6, 1, generator=g)
        if bool((y > 0).all()) or bool((y < 0).all()):
            return None
        return x, torch.tanh(y)

    def train(self, groups: list[tuple[torch.Tensor, torch.Tensor]], step: int) -> None:
        self.optimizer.zero_grad()
        x, y = torch.cat([g[0] for g in groups]), torch.cat([g[1] for g in groups])
        torch.nn.functional.mse_loss(self.model(x), -y).backward()
        self.optimizer.step()

    def sync_weights(self, version: int) -> None:
        self.syncs.append(version)
        self.generator = {k: v.clone() for k, v in self.model.state_dict().items()}

    def params(self) -> list[torch.Tensor]:
        return [p.detach().clone() for p in self.model.parameters()]

    def trainer(self, *, epochs: int = 2, **options: Any) -> AsyncTrainer[Any]:
        return AsyncTrainer(list(range(30)), self.rollout, self.train, batch_size=4,
                            sync_weights=self.sync_weights, epochs=epochs, seed=SEED,
                            **options)


def hand_written_sync_loop(rl: TorchRL, epochs: int) -> list[list[int]]:
    """What users write: walk the permutation, collect B groups, train, sync."""
    batches: list[list[int]] = []

    async def main() -> None:
        for epoch in range(epochs):
            order, pos = epoch_order(30, SEED, epoch), 0
            while pos < len(order):
                batch: list[tuple[int, Any]] = []
                while len(batch) < 4 and pos < len(order):
                    group = await rl.rollout(order[pos], order[pos])
                    if group is not None:
                        batch.append((order[pos], group))
                    pos += 1
                if batch:
                    batch.sort(key=lambda item: item[0])
                    rl.train([g for _, g in batch], len(batches))
                    batches.append([uid for uid, _ in batch])
                    rl.sync_weights(len(batches))

    asyncio.run(main())
    return batches


@pytest.mark.parametrize("concurrency", [None, 3])
def test_max_staleness_0_equals_sync_true_bit_for_bit(concurrency: int | None) -> None:
    reference = TorchRL()
    expected = hand_written_sync_loop(reference, epochs=2)
    runs: dict[str, tuple[list[StepMetrics], list[torch.Tensor]]] = {}
    for name, options in (("sync", {"sync": True}), ("S=0", {"max_staleness": 0})):
        rl = TorchRL()
        metrics = rl.trainer(max_concurrency=concurrency, **options).run()
        runs[name] = (metrics, rl.params())
    for metrics, params in runs.values():
        assert [m["uids"] for m in metrics] == expected
        assert all(s == 0 for m in metrics for s in m["staleness"])
        for p, q in zip(params, reference.params()):
            assert torch.equal(p, q)
    assert any(m["filtered"] for m in runs["S=0"][0])  # the weight-dependent filter did filter


def test_async_train_matches_thread_train_bit_for_bit() -> None:
    rl_thread, rl_async = TorchRL(), TorchRL()

    async def train_async(groups: list[tuple[torch.Tensor, torch.Tensor]], step: int) -> None:
        await asyncio.sleep(0)
        rl_async.train(groups, step)

    rl_thread.trainer(max_staleness=0).run()
    AsyncTrainer(list(range(30)), rl_async.rollout, train_async, batch_size=4, max_staleness=0,
                 sync_weights=rl_async.sync_weights, epochs=2, seed=SEED).run()
    for p, q in zip(rl_thread.params(), rl_async.params()):
        assert torch.equal(p, q)


# -- train runs beside the rollouts ---------------------------------------------------------------
@pytest.mark.parametrize("train_kind", ["thread", "async"])
def test_rollouts_are_admitted_and_finish_while_a_step_trains(train_kind: str) -> None:
    """Batch 1's rollouts block until step 0 is training; step 0 returns only once a rollout of
    batch 2 has started, which needs batch 1 to finish: all of it happens during step 0."""
    position = {uid: pos for pos, uid in enumerate(epoch_order(12, SEED, 0))}
    release = asyncio.Event()
    started_later = threading.Event()
    loop: asyncio.AbstractEventLoop | None = None

    async def rollout(prompt: int, uid: int) -> int | None:
        if position[uid] in (2, 3):
            await release.wait()
        if position[uid] >= 4:
            started_later.set()
        return uid

    def train(groups: list[int], step: int) -> None:
        assert threading.current_thread().name.startswith("actormesh-train")
        if step == 0:
            assert loop is not None
            loop.call_soon_threadsafe(release.set)
            assert started_later.wait(timeout=30), "no rollout started while step 0 trained"

    async def train_async(groups: list[int], step: int) -> None:
        if step == 0:
            release.set()
            while not started_later.is_set():
                await asyncio.sleep(0)

    async def main() -> list[StepMetrics]:
        nonlocal loop
        loop = asyncio.get_running_loop()
        trainer = AsyncTrainer(list(range(12)), rollout,
                               train if train_kind == "thread" else train_async,
                               batch_size=2, max_staleness=2, max_concurrency=2, seed=SEED)
        return await trainer.run_async()

    metrics = asyncio.run(main())
    by_position = {position[u]: v for m in metrics for u, v in zip(m["uids"], m["versions"])}
    assert by_position[4] == by_position[5] == 0  # started during step 0: version 0
    assert sorted(by_position) == list(range(12))


# -- filtering -------------------------------------------------------------------------------------
@pytest.mark.parametrize("max_staleness", [0, 2])
def test_filtered_groups_free_their_capacity_and_an_all_filtered_tail_ends_the_epoch(
        max_staleness: int) -> None:
    def mostly_filtered(uid: int) -> bool:
        return uid % 5 != 0

    async def rollout(prompt: int, uid: int) -> int | None:
        await yields(uid)
        return None if mostly_filtered(uid) else uid

    batches: list[list[int]] = []
    trainer = AsyncTrainer(list(range(23)), rollout, lambda g, s: batches.append(g),
                           batch_size=2, max_staleness=max_staleness, epochs=3, seed=SEED)
    metrics = trainer.run()
    assert batches == expected_batches(23, 2, 3, mostly_filtered)
    assert [m["uids"] for m in metrics] == batches
    assert trainer.epoch == 3 and trainer.state_dict()["consumed"] == []


def test_an_epoch_where_every_rollout_is_filtered_trains_nothing() -> None:
    async def rollout(prompt: int, uid: int) -> int | None:
        return None

    trainer = AsyncTrainer(list(range(9)), rollout, lambda g, s: None, batch_size=4,
                           max_staleness=1, epochs=2)
    assert trainer.run() == []
    assert trainer.epoch == 2 and trainer.step == 0


# -- failures -------------------------------------------------------------------------------------
def run_in_loop(trainer: AsyncTrainer[Any], max_steps: int | None = None) -> list[StepMetrics]:
    """Run through run_async and check that no task of the trainer outlives the run."""
    async def main() -> list[StepMetrics]:
        try:
            return await trainer.run_async(max_steps)
        finally:
            assert asyncio.all_tasks() == {asyncio.current_task()}

    return asyncio.run(main())


def test_a_rollout_that_raises_once_is_retried_and_trained_once() -> None:
    failed: set[int] = set()

    async def rollout(prompt: int, uid: int) -> int | None:
        await yields(uid)
        if uid % 4 == 1 and uid not in failed:
            failed.add(uid)
            raise ValueError(f"flaky {uid}")
        return uid

    trainer = AsyncTrainer(list(range(16)), rollout, lambda g, s: None, batch_size=4,
                           max_staleness=2, seed=SEED)
    metrics = run_in_loop(trainer)
    assert sorted(u for m in metrics for u in m["uids"]) == list(range(16))
    assert sum(m["retries"] for m in metrics) == len(failed) == 4


def test_a_rollout_that_always_raises_stops_the_run_naming_its_uid() -> None:
    cancelled: list[int] = []

    async def rollout(prompt: int, uid: int) -> int | None:
        if uid == 5:
            raise ValueError("bad prompt")
        try:
            await asyncio.Event().wait()  # the others never finish on their own
        except asyncio.CancelledError:
            cancelled.append(uid)
            raise
        return uid

    trainer = AsyncTrainer(list(range(12)), rollout, lambda g, s: None, batch_size=4,
                           max_staleness=1, rollout_retries=2, seed=SEED)
    with pytest.raises(RolloutError, match="uid 5 failed 3 times") as info:
        run_in_loop(trainer)
    assert info.value.uid == 5 and info.value.attempts == 3
    assert isinstance(info.value.__cause__, ValueError)
    assert cancelled and 5 not in cancelled  # the others were cancelled, not left behind
    assert trainer.step == 0 and no_train_thread()


def test_a_hanging_rollout_is_cancelled_at_its_timeout_and_retried() -> None:
    hung: list[int] = []

    async def rollout(prompt: int, uid: int) -> int | None:
        if uid == 3 and not hung:
            hung.append(uid)
            await asyncio.Event().wait()  # never returns: only the timeout can end it
        await yields(uid)
        return uid

    trainer = AsyncTrainer(list(range(8)), rollout, lambda g, s: None, batch_size=4,
                           max_staleness=1, rollout_timeout_s=0.2, seed=SEED)
    metrics = run_in_loop(trainer)
    assert sorted(u for m in metrics for u in m["uids"]) == list(range(8))
    assert hung == [3] and sum(m["retries"] for m in metrics) >= 1


def test_a_rollout_that_always_hangs_fails_with_a_timeout_naming_its_uid() -> None:
    async def rollout(prompt: int, uid: int) -> int | None:
        if uid == 6:
            await asyncio.Event().wait()
        return uid

    trainer = AsyncTrainer(list(range(8)), rollout, lambda g, s: None, batch_size=2,
                           max_staleness=0, rollout_timeout_s=0.1, rollout_retries=1, seed=SEED)
    with pytest.raises(RolloutError, match="uid 6 failed 2 times.*rollout_timeout_s=0.1"):
        run_in_loop(trainer)


def test_a_rollout_that_ignores_cancellation_is_named_not_waited_for_forever(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rollout_module, "CANCEL_GRACE_S", 0.1)
    release = asyncio.Event()

    async def stubborn(prompt: int, uid: int) -> int | None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await release.wait()  # swallows the cancellation until the test lets it go
        return uid

    async def main() -> None:
        trainer = AsyncTrainer([0], stubborn, lambda g, s: None, batch_size=1,
                               rollout_timeout_s=0.1)
        with pytest.raises(RolloutError, match="uid 0.*did not stop within 0.1 s"):
            await trainer.run_async()
        release.set()
        await asyncio.sleep(0)

    asyncio.run(main())


@pytest.mark.parametrize("train_kind", ["thread", "async"])
def test_train_raising_stops_the_run_with_its_own_exception(train_kind: str) -> None:
    boom = KeyError("the loss is nan")
    rec = Recorder(batch_size=3, max_staleness=2)

    def train(groups: list[int], step: int) -> None:
        if step == 2:
            raise boom
        rec.train(groups, step)

    async def train_async(groups: list[int], step: int) -> None:
        train(groups, step)

    trainer = make(rec, 30, epochs=1, train=train if train_kind == "thread" else train_async)
    with pytest.raises(KeyError) as info:
        run_in_loop(trainer)
    assert info.value is boom
    assert trainer.step == 2 and len(trainer.state_dict()["consumed"]) == 6
    assert no_train_thread()


def test_sync_weights_raising_stops_the_run_and_the_next_run_syncs_first() -> None:
    rec = Recorder(batch_size=2, max_staleness=1)
    calls: list[int] = []

    async def sync_weights(version: int) -> None:
        calls.append(version)
        if version == 2 and calls.count(2) == 1:
            raise ConnectionError("engine gone")
        await rec.sync_weights(version)

    trainer = AsyncTrainer(list(range(10)), rec.rollout, rec.train, batch_size=2,
                           max_staleness=1, sync_weights=sync_weights, seed=SEED)
    with pytest.raises(ConnectionError):
        run_in_loop(trainer)
    assert trainer.step == 2  # step 1 trained; its weights did not reach the generator
    run_in_loop(trainer)
    assert calls[:3] == [1, 2, 2] and rec.batches == expected_batches(10, 2, 1)


# -- resume ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("stop_after", [1, 5, 8])
def test_resume_at_max_staleness_0_is_exact(stop_after: int) -> None:
    whole = TorchRL()
    whole_metrics = whole.trainer(max_staleness=0).run()

    first = TorchRL()
    stopped = first.trainer(max_staleness=0)
    part1 = stopped.run(max_steps=stop_after)
    state = json.loads(json.dumps(stopped.state_dict()))
    second = TorchRL()
    second.model.load_state_dict(first.model.state_dict())  # the user's checkpoint
    second.optimizer.load_state_dict(first.optimizer.state_dict())
    second.generator = {k: torch.zeros_like(v) for k, v in second.generator.items()}
    resumed = second.trainer(max_staleness=0)
    resumed.load_state_dict(state)
    part2 = resumed.run()
    assert second.syncs[0] == stop_after  # the generator was brought to the loaded version
    assert [m["uids"] for m in part1 + part2] == [m["uids"] for m in whole_metrics]
    assert [m["step"] for m in part2] == list(range(stop_after, len(whole_metrics)))
    for p, q in zip(second.params(), whole.params()):
        assert torch.equal(p, q)


def test_resume_at_max_staleness_2_loses_and_repeats_no_prompt() -> None:
    rec = Recorder(batch_size=3, max_staleness=2)
    trainer = make(rec, 40, epochs=2)
    first = run_in_loop(trainer, max_steps=4)
    state = json.loads(json.dumps(trainer.state_dict()))
    assert len(state["consumed"]) == 12

    rec2 = Recorder(batch_size=3, max_staleness=2)
    rec2.batches = list(rec.batches)  # the record goes on where the first trainer stopped
    resumed = make(rec2, 40, epochs=2)
    resumed.load_state_dict(state)
    second = run_in_loop(resumed, max_steps=3)
    third = run_in_loop(resumed)
    metrics = first + second + third
    assert [m["step"] for m in metrics] == list(range(len(metrics)))
    for epoch in (0, 1):
        uids = [u for m in metrics if m["epoch"] == epoch for u in m["uids"]]
        assert sorted(uids) == [u for u in range(40) if not is_filtered(u)]
    assert [m["uids"] for m in metrics] == rec2.batches == expected_batches(40, 3, 2)
    assert all(s <= 2 for m in metrics for s in m["staleness"])


def test_load_state_dict_refuses_a_state_that_does_not_fit() -> None:
    rec = Recorder(batch_size=3, max_staleness=1)
    trainer = make(rec, 20, epochs=1)
    trainer.run(max_steps=2)
    state = dict(trainer.state_dict())
    other_seed = AsyncTrainer(list(range(20)), rec.rollout, rec.train, batch_size=3, seed=1)
    with pytest.raises(ValueError, match="seed=7 but this trainer has seed=1"):
        other_seed.load_state_dict(state)
    with pytest.raises(ValueError, match="num_prompts=20 but this trainer has num_prompts=21"):
        make(rec, 21).load_state_dict(state)
    with pytest.raises(ValueError, match="not the first uids of its permutation"):
        make(rec, 20).load_state_dict({**state, "consumed": state["consumed"][1:] + [19]})
    with pytest.raises(ValueError, match="counters"):
        make(rec, 20).load_state_dict(
            {**state, "counters": {**state["counters"], "accepted": 0}})
    with pytest.raises(ValueError, match="missing epoch"):
        make(rec, 20).load_state_dict({k: v for k, v in state.items() if k != "epoch"})


# -- the API's edges ------------------------------------------------------------------------------
def test_run_inside_a_running_loop_points_to_run_async() -> None:
    rec = Recorder(batch_size=2, max_staleness=1)
    trainer = make(rec, 4)

    async def main() -> None:
        with pytest.raises(RuntimeError, match=r"await trainer.run_async\(\)"):
            trainer.run()

    asyncio.run(main())


def test_run_continues_where_the_last_run_stopped() -> None:
    rec = Recorder(batch_size=4, max_staleness=1)
    trainer = make(rec, 40, epochs=2)
    steps = [len(trainer.run(max_steps=3)) for _ in range(3)] + [len(trainer.run())]
    assert steps[:3] == [3, 3, 3] and trainer.run() == []
    assert rec.batches == expected_batches(40, 4, 2)


async def _rollout(prompt: int, uid: int) -> int | None:
    return uid


def _train(groups: list[int], step: int) -> None:
    pass


@pytest.mark.parametrize(("options", "message"), [
    ({"batch_size": 0}, "batch_size=0: must be an int >= 1"),
    ({"batch_size": True}, "batch_size=True"),
    ({"max_staleness": -1}, "max_staleness=-1"),
    ({"max_concurrency": 0}, "max_concurrency=0"),
    ({"epochs": 0}, "epochs=0"),
    ({"rollout_retries": -1}, "rollout_retries=-1"),
    ({"rollout_timeout_s": 0}, "rollout_timeout_s=0"),
    ({"rollout_timeout_s": float("inf")}, "rollout_timeout_s=inf"),
    ({"rollout_timeout_s": float("nan")}, "rollout_timeout_s=nan"),
    ({"seed": 1.5}, "seed=1.5"),
])
def test_bad_settings_are_refused_naming_the_value(options: dict[str, Any], message: str) -> None:
    settings: dict[str, Any] = {"batch_size": 2, **options}
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        AsyncTrainer([1, 2, 3], _rollout, _train, **settings)


def test_bad_arguments_are_refused_before_anything_runs() -> None:
    with pytest.raises(ValueError, match="prompts is empty"):
        AsyncTrainer([], _rollout, _train, batch_size=2)
    with pytest.raises(TypeError, match="train must be a callable"):
        AsyncTrainer([1], _rollout, "train", batch_size=2)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="prompts must be a sequence"):
        AsyncTrainer({1, 2}, _rollout, _train, batch_size=2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_steps=-1"):
        AsyncTrainer([1], _rollout, _train, batch_size=2).run(max_steps=-1)


def test_a_rollout_may_return_any_awaitable() -> None:
    def rollout(prompt: int, uid: int) -> Awaitable[int | None]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int | None] = loop.create_future()
        loop.call_soon(future.set_result, uid)
        return future

    metrics = AsyncTrainer(list(range(6)), rollout, _train, batch_size=3, seed=SEED).run()
    assert sorted(u for m in metrics for u in m["uids"]) == list(range(6))


def test_cancelling_run_async_stops_the_rollouts_without_waiting_for_a_busy_train_thread(
        caplog: pytest.LogCaptureFixture) -> None:
    training, release = asyncio.Event(), threading.Event()
    rollouts_cancelled: list[int] = []
    first_batch = epoch_order(40, SEED, 0)[:2]

    async def rollout(prompt: int, uid: int) -> int | None:
        try:
            await yields(uid)
            if uid not in first_batch:
                await asyncio.Event().wait()
        except asyncio.CancelledError:
            rollouts_cancelled.append(uid)
            raise
        return uid

    async def main() -> None:
        loop = asyncio.get_running_loop()

        def train(groups: list[int], step: int) -> None:
            loop.call_soon_threadsafe(training.set)
            assert release.wait(timeout=30)

        trainer = AsyncTrainer(list(range(40)), rollout, train, batch_size=2, max_staleness=4,
                               seed=SEED)
        run = asyncio.create_task(trainer.run_async())
        await asyncio.wait_for(training.wait(), timeout=30)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        assert asyncio.all_tasks() == {asyncio.current_task()}
        assert rollouts_cancelled and trainer.step == 0

    with caplog.at_level("WARNING", logger="actormesh.trainer"):
        try:
            asyncio.run(main())
        finally:
            release.set()  # the blocked step may end now: its thread goes with it
    assert "still runs in its thread" in caplog.text
    for thread in threading.enumerate():
        if thread.name.startswith("actormesh-train"):
            thread.join(timeout=30)
    assert no_train_thread()


def test_one_run_at_a_time() -> None:
    gate = asyncio.Event()

    async def rollout(prompt: int, uid: int) -> int | None:
        await gate.wait()
        return uid

    async def main() -> None:
        trainer = AsyncTrainer([0, 1], rollout, _train, batch_size=1)
        first = asyncio.create_task(trainer.run_async())
        await asyncio.sleep(0)
        with pytest.raises(RuntimeError, match="already running"):
            await trainer.run_async()
        gate.set()
        assert len(await first) == 2

    asyncio.run(main())
