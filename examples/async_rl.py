"""Asynchronous RL end to end: a tiny Llama learns a task by GRPO, trained on a `TorchMesh`,
sampled on an `EnginePool` of vLLM engines, the two overlapped by `AsyncTrainer`.

    python examples/async_rl.py                      # 2 vLLM engines, 1 learner, 150 steps
    python examples/async_rl.py --learners 2         # DDP over 2 processes (gloo)
    python examples/async_rl.py --fake --steps 6     # FakeEngine: the loop without vLLM

The task ("answer in the prompt's colour"). A prompt is `<s>`, a colour word (` red` or
` blue`), then 3 to 8 random words of the tiny model's corpus. The model samples 8 tokens
(temperature 1); the reward is the fraction of them that are whole-word tokens of the
colour's half of the corpus: words beginning with a to m for red (26 tokens, ` actor`,
` batch`, ...), n to z for blue (32 tokens, ` pool`, ` queue`, ...). The untrained model
spreads its probability over all 1000 ids, so it starts near chance (about 0.03); to score it
must read the colour at the start of the prompt and move its mass onto the right 26 or 32 ids.
The prompt's other words name no colour: given blue prompts with ` red` further on, the model
learns the shortcut "any red means red", and once most groups score alike (no advantage left
to correct it) those prompts fall to 0.

What runs where:
- the engines (`EnginePool`, vLLM's `AsyncLLM` in Ray actors) sample a group of `--group`
  completions per prompt (`generate_group`, one engine, a seed per (seed, uid, sample)) and
  return each token's log-probability and the weight version that produced it;
- the learners (`TorchMesh`, one process per `--learners`, `DistributedDataParallel` over gloo
  when there are 2 or more) each take a slice of the batch (`shard`) and step on the clipped
  importance-weighted policy gradient (PPO / GRPO): per token,
  `-min(ratio * A, clip(ratio, 1 - 0.2, 1 + 0.2) * A)` with `ratio = exp(logp_new - logp_engine)`
  and `A = reward - mean reward of the group`;
- the driver runs `AsyncTrainer(max_staleness=1)`: while the learners train step k, the engines
  already generate the groups of step k + 1 on the weights of step k - 1 or k. After every step
  rank 0 sends its state dict into every engine itself (`sender.send(..., version=step + 1)`,
  a `pool.weight_sender()` passed to it: one gloo group from rank 0 to the engine workers; the
  weights never pass through the driver).

It prints one line per step (reward; staleness: the step minus the weight version of the
oldest token it trains on, as the engines tagged it; tokens generated per second; weight-sync
time), writes `async_rl.png` (reward, and staleness as the trainer reports it, per step) and
`results.json` into `--out`, and ends with `reward A -> B`: the mean reward of the first and of
the last 5 steps. On this 2-core machine the default run takes about 1.5 minutes, half of it
starting the engines, and goes from about 0.03 to about 0.99.

With `--fake`, the engines are `FakeEngine`s: deterministic tokens that ignore the sampling
settings, so every group's samples are alike and nothing is learnt, but every part of the loop
(rollouts, staleness, sharded learner steps, weight pushes with versions) runs in seconds. A
`FakeEngine` models a one-layer subset of a Llama under names without the `model.` prefix: the
learner's tensors of those names are what the pool checks and loads.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import ray

import actormesh as am
from actormesh.integrations.torch import TorchMesh
from actormesh.integrations.trainer import AsyncTrainer, StepMetrics
from actormesh.integrations.vllm import EnginePool, FakeEngine, Generation, WeightSender
from actormesh.integrations.vllm.tiny import VOCAB_SIZE, build_tiny_llama

CLIP = 0.2
"""The PPO clip range of the importance ratio."""
MAX_GRAD_NORM = 1.0
"""Gradients are clipped to this norm: a token the engines sampled at a tiny probability can
have a large ratio, and with a negative advantage the clipped objective does not bound it."""
FIRST_LAST = 5
"""`reward A -> B` compares the mean reward of this many first and last steps."""


# -- the task ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Task:
    """Token ids of the task: the colours, and the words that score after each."""

    red: int
    blue: int
    body: tuple[int, ...]
    """The words a prompt's body is made of: every word but the colours."""
    targets: Mapping[int, frozenset[int]]
    """colour token -> the ids that score after it."""

    def chance(self) -> float:
        """The reward of a policy uniform over the model's ids, averaged over both colours."""
        return sum(len(t) for t in self.targets.values()) / len(self.targets) / VOCAB_SIZE


def make_task(model_dir: Path) -> Task:
    """The colours and the whole-word tokens (a space and 3 or more letters) of the tokenizer."""
    from transformers import AutoTokenizer

    tokenizer: Any = AutoTokenizer.from_pretrained(model_dir)
    words: dict[str, int] = {}
    for token_id in range(len(tokenizer)):
        text = tokenizer.decode([token_id])
        if text.startswith(" ") and len(text) >= 4 and text[1:].isalpha():
            words[text[1:]] = token_id
    red, blue = words["red"], words["blue"]
    first_half = frozenset(i for w, i in words.items() if w[0] <= "m")
    second_half = frozenset(words.values()) - first_half
    body = tuple(sorted(i for w, i in words.items() if w not in ("red", "green", "blue")))
    return Task(red, blue, body, {red: first_half, blue: second_half})


def make_prompts(task: Task, count: int, seed: int) -> list[list[int]]:
    """`<s>`, a colour, then 3 to 8 words that name no colour."""
    rng = random.Random(seed)
    return [[1, rng.choice((task.red, task.blue))]
            + [rng.choice(task.body) for _ in range(rng.randint(3, 8))] for _ in range(count)]


def reward(task: Task, prompt: Sequence[int], completion: Sequence[int]) -> float:
    """The fraction of the completion's tokens that belong to the prompt's colour."""
    targets = task.targets[prompt[1]]
    return sum(token in targets for token in completion) / len(completion)


# -- the learners: one process each of a TorchMesh ----------------------------------------------
class Sample(TypedDict):
    """One completion as the learners see it: prompt + completion tokens, the engine's
    log-probability of each completion token (the behaviour policy), and its advantage."""

    tokens: list[int]
    prompt_len: int
    logprobs: list[float]
    advantage: float


class LearnerStats(TypedDict):
    loss: float
    clipped: float
    """Fraction of tokens whose ratio was outside the clip range."""
    logprob_gap: float
    """Mean |learner - engine| log-probability of the sampled tokens, before the step."""


class Learner:
    """One process of the learner world: the tiny Llama in float32, under DDP when the world
    has more than one process (the torch world exists before `__init__` runs)."""

    def __init__(self, model_dir: str, learning_rate: float) -> None:
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
        from transformers import LlamaForCausalLM

        torch.set_num_threads(1)
        llama: Any = LlamaForCausalLM
        self.model: Any = llama.from_pretrained(model_dir, torch_dtype=torch.float32)
        self.model.train()
        self.ddp: Any = (DistributedDataParallel(self.model) if dist.get_world_size() > 1
                         else self.model)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=learning_rate)

    @am.method(dispatch=am.dispatch.split())
    def step(self, samples: list[Sample]) -> list[LearnerStats]:
        """One optimizer step on this process's slice of the batch (DDP averages gradients)."""
        import torch

        width = max(len(s["tokens"]) for s in samples)
        ids = torch.zeros(len(samples), width, dtype=torch.long)
        attention = torch.zeros(len(samples), width, dtype=torch.long)
        scored = torch.zeros(len(samples), width - 1)  # which next-token predictions count
        behaviour = torch.zeros(len(samples), width - 1)
        for row, s in enumerate(samples):
            n, p = len(s["tokens"]), s["prompt_len"]
            ids[row, :n] = torch.tensor(s["tokens"])
            attention[row, :n] = 1
            scored[row, p - 1:n - 1] = 1.0
            behaviour[row, p - 1:n - 1] = torch.tensor(s["logprobs"])
        advantage = torch.tensor([s["advantage"] for s in samples])[:, None]

        logits = self.ddp(input_ids=ids, attention_mask=attention).logits[:, :-1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]
        ratio = torch.exp(logp - behaviour)
        per_token = -torch.minimum(ratio * advantage,
                                   torch.clamp(ratio, 1 - CLIP, 1 + CLIP) * advantage)
        loss = (per_token * scored).sum() / scored.sum()
        self.optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), MAX_GRAD_NORM)
        self.optimizer.step()
        with torch.no_grad():
            count = float(scored.sum())
            clipped = (((ratio - 1).abs() > CLIP).float() * scored).sum() / count
            gap = ((logp - behaviour).abs() * scored).sum() / count
        return [LearnerStats(loss=float(loss), clipped=float(clipped), logprob_gap=float(gap))]

    @am.method
    def push(self, sender: WeightSender, names: Mapping[str, str], version: int) -> int:
        """Send the model's parameters the engines load (learner name -> engine name) straight
        to every engine; returns the version they serve."""
        state = self.model.state_dict()
        return sender.send([(names[n], v) for n, v in state.items() if n in names],
                           version=version)

    @am.method
    def weights(self) -> dict[str, np.ndarray]:
        """The model's parameters by checkpoint name (what `save_pretrained` writes)."""
        return {name: value.detach().numpy().copy()
                for name, value in self.model.state_dict().items()}


# -- the loop on the driver -------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Group:
    """One prompt's samples from the engines, with their rewards."""

    uid: int
    prompt: list[int]
    samples: list[Generation]
    rewards: list[float]


@dataclasses.dataclass
class StepRecord:
    step: int
    reward: float
    rewards: list[float]
    """Mean reward per group."""
    token_staleness: list[int]
    """Per group: the step minus the oldest weight version among its tokens."""
    tokens: int
    tokens_per_s: float
    learner: list[LearnerStats]
    sync_s: float = math.nan
    staleness: list[int] = dataclasses.field(default_factory=list)
    """Per group, as the trainer reports it (the version its rollout started with)."""


class Loop:
    """The three callbacks of `AsyncTrainer` over one pool and one learner mesh."""

    def __init__(self, task: Task, pool: EnginePool, learners: TorchMesh[Learner],
                 args: argparse.Namespace, num_prompts: int,
                 engine_names: Mapping[str, str]) -> None:
        self.task, self.pool, self.learners, self.args = task, pool, learners, args
        self.num_prompts = num_prompts
        self.engine_names = engine_names
        self.sampling = {"max_tokens": args.max_tokens, "temperature": 1.0, "ignore_eos": True}
        self.records: list[StepRecord] = []
        self.pushed: list[tuple[int, int]] = []
        """Per sync: the version the pool loaded, and the number of tensors."""
        self.sender = pool.weight_sender()
        self.tokens = 0
        self.start = self.mark = time.perf_counter()
        self.tokens_at_mark = 0

    async def rollout(self, prompt: list[int], uid: int) -> Group:
        """One group; its randomness depends on (seed, uid) only (sample i has seed base + i)."""
        n = self.args.group
        base = (self.args.seed * self.num_prompts + uid) * n
        samples = await self.pool.generate_group(prompt, {**self.sampling, "seed": base}, n=n)
        self.tokens += sum(len(s.token_ids) for s in samples)
        return Group(uid, prompt, samples,
                     [reward(self.task, prompt, s.token_ids) for s in samples])

    def train(self, groups: list[Group], step: int) -> None:
        """Runs on the trainer's worker thread: shard the batch over the learners and step."""
        now, tokens = time.perf_counter(), self.tokens
        batch: list[Sample] = []
        for g in groups:
            mean = statistics.fmean(g.rewards)
            batch += [Sample(tokens=g.prompt + s.token_ids, prompt_len=len(g.prompt),
                             logprobs=s.logprobs, advantage=r - mean)
                      for s, r in zip(g.samples, g.rewards)]
        stats = self.learners.methods.step.shard(batch).get(timeout=600)
        self.records.append(StepRecord(
            step=step,
            reward=statistics.fmean(r for g in groups for r in g.rewards),
            rewards=[statistics.fmean(g.rewards) for g in groups],
            token_staleness=[step - min(v for s in g.samples for v in s.weight_versions)
                             for g in groups],
            tokens=tokens - self.tokens_at_mark,
            tokens_per_s=(tokens - self.tokens_at_mark) / max(now - self.mark, 1e-9),
            learner=stats))
        self.mark, self.tokens_at_mark = now, tokens

    async def sync_weights(self, version: int) -> None:
        """Rank 0 sends its weights into every engine; later tokens carry `version`."""
        started = time.perf_counter()
        loaded = await self.learners[0].methods.push.choose(self.sender, self.engine_names,
                                                            version)
        record = self.records[-1]
        record.sync_s = time.perf_counter() - started
        self.pushed.append((loaded, len(self.engine_names)))
        print(f"step {record.step + 1:4d}/{self.args.steps}  reward {record.reward:.3f}  "
              f"staleness {_spread(record.token_staleness)}  "
              f"tokens/s {record.tokens_per_s:7.0f}  sync {record.sync_s * 1e3:5.0f} ms  "
              f"loss {statistics.fmean(s['loss'] for s in record.learner):+.4f}  "
              f"clipped {statistics.fmean(s['clipped'] for s in record.learner):.2f}  "
              f"t {time.perf_counter() - self.start:5.0f} s", flush=True)


def _spread(values: Sequence[int]) -> str:
    low, high = min(values), max(values)
    return f"{low}" if low == high else f"{low}-{high}"


def engine_names(learner_names: Sequence[str], engine_shapes: Mapping[str, Any]) -> dict[str, str]:
    """Learner parameter name -> the engines' checkpoint name, for the names the engines load.

    A vLLM engine loads the learner's checkpoint: the names are the same, and every one must
    be there. A `FakeEngine` loads a subset named without the `model.` prefix."""
    names = {}
    for name in learner_names:
        for candidate in (name, name.removeprefix("model.")):
            if candidate in engine_shapes:
                names[name] = candidate
                break
    return names


# -- the run ------------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="A tiny Llama learns to answer in the prompt's colour by GRPO: learners on "
                    "a TorchMesh, vLLM engines in an EnginePool, AsyncTrainer(max_staleness=1).")
    parser.add_argument("--steps", type=int, default=150, help="training steps (default 150)")
    parser.add_argument("--engines", type=int, default=2, help="generation engines (default 2)")
    parser.add_argument("--learners", type=int, default=1,
                        help="learner processes, DDP when 2 or more (default 1)")
    parser.add_argument("--out", type=Path, default=Path("async_rl_out"),
                        help="directory for the model, results.json and async_rl.png")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fake", action="store_true", help="FakeEngine instead of vLLM")
    parser.add_argument("--batch", type=int, default=16, help="groups per step (default 16)")
    parser.add_argument("--group", type=int, default=8, help="samples per prompt (default 8)")
    parser.add_argument("--max-tokens", type=int, default=8, help="tokens per sample (default 8)")
    parser.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (default 1e-3)")
    parser.add_argument("--max-staleness", type=int, default=1)
    args = parser.parse_args(argv)
    for name in ("steps", "engines", "learners", "batch", "group", "max_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.max_staleness < 0:
        parser.error(f"--max-staleness must be >= 0, got {args.max_staleness}")
    if args.steps < 2 * FIRST_LAST:
        print(f"note: with fewer than {2 * FIRST_LAST} steps the first and last "
              f"{FIRST_LAST} overlap", flush=True)
    return args


def main(args: argparse.Namespace) -> dict[str, Any]:
    """Run the example on the Ray cluster this process is connected to; return the summary
    it writes to `results.json`."""
    started = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    model_dir = build_tiny_llama(args.out / "tiny-llama")
    task = make_task(model_dir)
    prompts = make_prompts(task, args.steps * args.batch, args.seed)
    print(f"task: answer in the prompt's colour; {len(task.targets[task.red])} red and "
          f"{len(task.targets[task.blue])} blue words of {VOCAB_SIZE} ids, "
          f"chance {task.chance():.3f}", flush=True)

    engine_kind = "FakeEngine" if args.fake else "vLLM"
    # A FakeEngine's weights are a subset of the tiny Llama's (see the module docstring).
    engines: dict[str, Any] = ({"engine_cls": FakeEngine, "num_cpus": 0.5, "engine_args":
                                {"vocab_size": VOCAB_SIZE, "hidden_size": 64}}
                               if args.fake else {})
    print(f"starting {args.engines} {engine_kind} engines and {args.learners} learners",
          flush=True)
    with EnginePool(model_dir, args.engines, **engines) as pool, \
            TorchMesh(Learner, {"dp": args.learners}, backend="gloo", timeout_s=300,
                      args=(str(model_dir), args.lr), num_cpus=1) as learners:
        pool.wait_ready(timeout=600)
        learners.wait_ready(timeout=600)
        spec = pool.mesh.methods.weight_spec.choose().get(timeout=300)
        first = learners[0].methods.weights.choose().get(timeout=300)
        names = engine_names(list(first), spec.shapes)
        if not args.fake and len(names) != len(first):
            raise RuntimeError(f"the engines do not load {sorted(set(first) - set(names))}")
        ready = time.perf_counter()
        print(f"ready in {ready - started:.0f} s: {args.engines} engines, "
              f"{args.learners} learners in a {learners.backend} world"
              f"{' (DDP)' if args.learners > 1 else ''}; each sync pushes {len(names)} tensors",
              flush=True)

        loop = Loop(task, pool, learners, args, len(prompts), names)
        trainer = AsyncTrainer(prompts, loop.rollout, loop.train, batch_size=args.batch,
                               max_staleness=args.max_staleness, sync_weights=loop.sync_weights,
                               seed=args.seed)
        metrics = trainer.run()
        finished = time.perf_counter()
        final_version = pool.weight_version

    for record, m in zip(loop.records, metrics):
        record.staleness = m["staleness"]
    summary = summarize(args, loop, metrics, task, final_version,
                        startup_s=ready - started, loop_s=finished - ready,
                        wall_s=time.perf_counter() - started)
    (args.out / "results.json").write_text(json.dumps(summary, indent=1))
    plot(loop.records, task.chance(), args.max_staleness, args.out / "async_rl.png")
    report(summary, args.out)
    print(f"reward {summary['reward_first']:.3f} -> {summary['reward_last']:.3f}", flush=True)
    return summary


def summarize(args: argparse.Namespace, loop: Loop, metrics: list[StepMetrics], task: Task,
              final_version: int, *, startup_s: float, loop_s: float,
              wall_s: float) -> dict[str, Any]:
    records = loop.records
    rewards = [r.reward for r in records]
    staleness = [s for m in metrics for s in m["staleness"]]
    syncs = sorted(r.sync_s for r in records)
    return {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "engine": "FakeEngine" if args.fake else "vLLM",
        "steps": len(records),
        "chance": task.chance(),
        "reward_first": statistics.fmean(rewards[:FIRST_LAST]),
        "reward_last": statistics.fmean(rewards[-FIRST_LAST:]),
        "wall_s": wall_s,
        "startup_s": startup_s,
        "loop_s": loop_s,
        "tokens": loop.tokens,
        "tokens_per_s": loop.tokens / loop_s,
        "sync_ms_median": 1e3 * statistics.median(syncs),
        "sync_ms_max": 1e3 * syncs[-1],
        "staleness_counts": {str(s): staleness.count(s) for s in sorted(set(staleness))},
        "weight_versions_pushed": [version for version, _ in loop.pushed],
        "tensors_pushed": [count for _, count in loop.pushed],
        "final_weight_version": final_version,
        "per_step": [dataclasses.asdict(r) for r in records],
        "trainer": metrics,
    }


def report(summary: dict[str, Any], out: Path) -> None:
    curve = summary["per_step"]
    every = max(1, len(curve) // 10)
    shown = curve[::every] + ([] if (len(curve) - 1) % every == 0 else curve[-1:])
    points = ", ".join(f"{r['step']}: {r['reward']:.2f}" for r in shown)
    print(f"wall time {summary['wall_s']:.0f} s (start-up {summary['startup_s']:.0f} s, "
          f"{summary['steps']} steps in {summary['loop_s']:.0f} s)")
    print(f"reward by step: {points} (chance {summary['chance']:.3f})")
    print(f"generated {summary['tokens']} tokens, {summary['tokens_per_s']:.0f} tokens/s "
          f"over the loop; weight sync median {summary['sync_ms_median']:.0f} ms "
          f"(max {summary['sync_ms_max']:.0f} ms)")
    counts = ", ".join(f"{n} groups at {s}" for s, n in summary["staleness_counts"].items())
    print(f"staleness (trainer): {counts}; weights pushed as versions "
          f"1..{summary['final_weight_version']}")
    print(f"wrote {out / 'results.json'} and {out / 'async_rl.png'}", flush=True)


def plot(records: list[StepRecord], chance: float, max_staleness: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r.step for r in records]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 1.4]})
    top.plot(steps, [r.reward for r in records], color="tab:blue", label="mean reward")
    top.fill_between(steps, [min(r.rewards) for r in records],
                     [max(r.rewards) for r in records], color="tab:blue", alpha=0.15,
                     label="groups' range")
    top.axhline(chance, color="grey", linestyle="--", linewidth=1, label="chance")
    top.set_ylim(0, 1.02)
    top.set_ylabel("reward")
    top.legend(loc="lower right")
    top.set_title("answer in the prompt's colour: GRPO on an EnginePool, "
                  f"AsyncTrainer(max_staleness={max_staleness})", fontsize=10)
    bottom.plot(steps, [statistics.fmean(r.staleness) if r.staleness else math.nan
                        for r in records], color="tab:orange", label="trainer (mean of groups)")
    bottom.plot(steps, [max(r.token_staleness) for r in records], color="tab:red",
                linestyle=":", label="oldest token's weights (max)")
    bottom.set_ylim(-0.1, max([1, *(max(r.token_staleness) for r in records)]) + 0.3)
    bottom.set_ylabel("staleness (steps)")
    bottom.set_xlabel("step")
    bottom.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    parsed = parse_args(sys.argv[1:])
    ray.init(address="local", num_cpus=max(4, parsed.engines + parsed.learners),
             include_dashboard=False, log_to_driver=False,
             object_store_memory=256 * 1024**2)
    try:
        main(parsed)
    finally:
        ray.shutdown()
