"""`AsyncTrainer`: the fully asynchronous RL loop of AReaL and SkyRL, on any async generator.

```python
from actormesh.integrations.trainer import AsyncTrainer

async def rollout(prompt: list[int], uid: int) -> Group | None:   # None filters the prompt out
    return make_group(await pool.generate_group(prompt, {"seed": uid}, n=8))
def train(groups: list[Group], step: int) -> None: ...             # runs in a worker thread
sender = pool.weight_sender()                                      # picklable
async def sync_weights(version: int) -> None:    # the learner's rank 0 sends its own weights
    await learners[0].methods.push.choose(sender, version)   # in it: sender.send(state, ...)

trainer = AsyncTrainer(prompts, rollout, train, batch_size=32, max_staleness=2,
                       sync_weights=sync_weights, max_concurrency=128)
for m in trainer.run():
    history.append((m["step"], m["staleness"]))
```

The rules, exactly (B = `batch_size`, S = `max_staleness`):

- **uid**: a prompt's index in `prompts`. Epoch e visits the prompts in the order
  `epoch_order(len(prompts), seed, e)`, a seeded permutation; `sync=True` uses the same one.
- **Step**: one call `train(groups, step)`, step = 0, 1, 2, ... over all epochs. Its batch is the
  next B *accepted* groups in permutation order (a rollout that returned `None` is filtered and
  skipped); the last batch of an epoch takes what is left (fewer groups; none: no step). A batch
  never mixes epochs, and is handed over sorted by uid. After every step (the last of a run
  included) `sync_weights(step + 1)` is awaited.
- **Version**: the number of steps whose `sync_weights` has returned (without `sync_weights`:
  whose `train` has returned). A rollout attempt records the version current when it started,
  the newest weights the generator could have used; a group's **staleness** is the step that
  trains it minus that version. A rollout that starts while step k trains has version k.
- **Admission**: one rollout per prompt, started in permutation order while
  `accepted + running < (S + v + 1) * B` and `running < max_concurrency`, where, within the
  epoch, `running` counts started rollouts not yet returned, `accepted` those that returned a
  group (trained or buffered), and `v` the steps synced. A filtered rollout counts in neither,
  so its place is taken by the next prompt; nothing is ever dropped. The capacity a new version
  opens is used only once its `sync_weights` has returned. `run(max_steps=k)` further starts no
  rollout that its remaining steps cannot train.
- **Epochs** are drained: the next epoch's first rollout starts once the last step of the
  previous one is synced. At the boundary nothing runs, every submitted rollout was accepted or
  filtered, and every accepted group was trained (checked; a violation is a `TrainerError`).
  Every prompt is trained exactly once per epoch unless filtered.
- **Why batches follow the permutation, not completion order.** The i-th group accepted in an
  epoch is trained in the epoch's step i // B. When it was admitted at version v, every prompt
  before it was accepted, running or filtered, so i <= accepted + running < (S + v + 1) * B:
  its staleness is at most S, for every group. Training the first B groups to *complete*
  (AReaL, SkyRL) bounds only the number of groups in flight: with B = 1, S = 1, a slow rollout
  admitted at version 0 can be overtaken at every step and trained arbitrarily late. Permutation
  order also makes what each batch contains independent of timing (it depends only on which
  prompts were filtered), and committed progress a prefix of the permutation, which resume
  needs. The price: a step waits for its slowest group, while up to S later batches generate.
- **S = 0 is `sync=True`, bit for bit.** The capacity is one batch, so the rollouts of batch k+1
  start only after `sync_weights(k+1)` returned, all with version k+1, and a filtered prompt is
  replaced by the next in the permutation, exactly what the synchronous loop does (generate the
  next B prompts, replace the filtered ones by the next, train, sync). So when a rollout's
  randomness depends only on (seed, uid) and the weights, both train the same batches in the
  same order on groups made with the same weights, and end with identical parameters.
- **Failures**: a rollout that raises or runs past `rollout_timeout_s` is cancelled and tried
  again, up to `rollout_retries` times; then the run stops with `RolloutError` naming the uid.
  An exception from `train`, `sync_weights` or `on_transition` stops the run and propagates
  unchanged. A stopping run cancels every rollout it started and waits for them to end; waits
  without a timeout of their own log a warning every 60 s naming what they wait for (a hang is
  never silent).
- **Resume**: `run(max_steps=k)` stops after k steps; `state_dict()` holds the committed
  progress (epoch, step, the epoch's consumed and filtered uids, its counters) and a new trainer
  with the same prompts and seed continues after `load_state_dict()` (its first run calls
  `sync_weights(step)`). For S = 0 this is exact: the same batches and parameters as one
  uninterrupted run. For S > 0 no prompt is lost or trained twice, but the groups that were
  buffered or still generating at the stop are discarded and generated again, with newer weights.
- **Threads**: a plain `train` / `sync_weights` runs on one worker thread owned by the run, so
  the event loop keeps admitting and finishing rollouts meanwhile; coroutine functions run on the
  loop. `run()` owns an event loop (and refuses to run inside one); `await run_async()` uses the
  caller's. Rollouts are tasks of that loop: they may await an `EnginePool`, an `ActorMesh`
  future or any coroutine.
"""

from ._errors import RolloutError, TrainerError
from ._ledger import Counters, Transition
from ._metrics import StepMetrics
from ._progress import EpochCounters, TrainerState, epoch_order
from ._trainer import AsyncTrainer

__all__ = [
    "AsyncTrainer",
    "Counters",
    "EpochCounters",
    "RolloutError",
    "StepMetrics",
    "TrainerError",
    "TrainerState",
    "Transition",
    "epoch_order",
]
