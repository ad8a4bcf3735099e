"""`python -m benchmarks.side.weights_gpu`: weights shared over CUDA IPC on one GPU (needs one).

The weight sender's `ipc` backend for CUDA tensors, without vLLM or Ray (the GPU machines this
project is lent have neither): this process holds the ~200 MiB bfloat16 Llama state dict of
`benchmarks.side.weights` (its shapes, random values) on GPU 0, and `--receivers` processes on
the same GPU each hold a model of those shapes there, as an engine's worker does, and load what
they receive into it (`copy_`, then a stream synchronisation). Taking turns within each repeat,
in the same run:

- `floor`: this process copies every tensor into as many models of its own (device to device):
  the least any transfer that ends in the receivers' models costs;
- `torch.multiprocessing`: the tensors themselves put on a `torch.multiprocessing` queue (torch
  shares each as a CUDA IPC handle, as verl's colocated path does), each receiver copying them
  into its model: what a user has with torch alone;
- `ipc` twice (the second is the A/A control): `_transfer.send_bucket` over an `ipc` formation
  in 32 MiB buckets (`DEFAULT_BUCKET_BYTES`), as `WeightSender.send` streams them: each bucket
  written once into one of two CUDA slots that the send reuses (each receiver opens each slot's
  handle once), each receiver copying the blob out and loading its tensors while the sender
  writes the next bucket into the other slot;
- `through the host`: the same stream with the tensors first copied to the CPU (the `ipc`
  backend's memfd path, then each receiver copies to its GPU): what the sender does without
  CUDA IPC.

A repeat's time runs from the start of the send until every receiver has loaded the last
tensor. Printed: the median, min and max of each over `--repeats`, and each one's median against
the floor's.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import time
from typing import Any

SHAPES = {"hidden": 1024, "intermediate": 2816, "layers": 8, "vocab": 256}


def llama_shapes() -> list[tuple[str, tuple[int, ...]]]:
    """The state dict's names and shapes (75 tensors, ~200 MiB in bfloat16)."""
    h, i = SHAPES["hidden"], SHAPES["intermediate"]
    shapes: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (SHAPES["vocab"], h))]
    for n in range(SHAPES["layers"]):
        p = f"model.layers.{n}"
        shapes += [(f"{p}.self_attn.{w}_proj.weight", (h, h)) for w in "qkvo"]
        shapes += [(f"{p}.mlp.gate_proj.weight", (i, h)), (f"{p}.mlp.up_proj.weight", (i, h)),
                   (f"{p}.mlp.down_proj.weight", (h, i)),
                   (f"{p}.input_layernorm.weight", (h,)),
                   (f"{p}.post_attention_layernorm.weight", (h,))]
    return [*shapes, ("model.norm.weight", (h,)), ("lm_head.weight", (SHAPES["vocab"], h))]


def receiver(rank: int, orders: Any, done: Any) -> None:
    """A receiver process: a model of the shapes on GPU 0, loaded from each send it is told of."""
    import torch

    from actormesh.integrations.vllm import _transfer

    torch.cuda.set_device(0)
    model = {n: torch.empty(s, dtype=torch.bfloat16, device="cuda") for n, s in llama_shapes()}
    done.put(("ready", rank))
    while (order := orders.get(timeout=300)) is not None:
        kind, payload = order
        if kind == "tensors":  # torch.multiprocessing: the tensors themselves, as IPC handles
            for name, tensor in payload:
                model[name].copy_(tensor)
            del payload, tensor
        else:  # an ipc formation: the stream of buckets
            plan, device = _transfer.Formation.from_wire(payload[0]), payload[1]
            group = _transfer.join("bench-receiver", plan, rank)
            try:
                for name, tensor in _transfer.receive(group, device):
                    model[name].copy_(tensor, non_blocking=False)
            finally:
                _transfer.drop("bench-receiver")
        torch.cuda.synchronize()
        done.put(("loaded", rank))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--receivers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()

    import torch
    import torch.multiprocessing as mp
    from torch._C._distributed_c10d import TCPStore

    from actormesh.integrations.vllm import _transfer
    from actormesh.integrations.vllm._sender import DEFAULT_BUCKET_BYTES

    if not torch.cuda.is_available():
        raise SystemExit("weights_gpu needs a GPU")
    torch.cuda.set_device(0)
    generator = torch.Generator(device="cuda").manual_seed(0)
    state = [(n, torch.randn(s, dtype=torch.bfloat16, device="cuda", generator=generator))
             for n, s in llama_shapes()]
    nbytes = sum(t.numel() * t.element_size() for _, t in state)
    dtypes = {n: "bfloat16" for n, _ in state}
    copies = [{n: torch.empty_like(t) for n, t in state} for _ in range(args.receivers)]

    context = mp.get_context("spawn")
    done = context.Queue()
    orders = [context.Queue() for _ in range(args.receivers)]
    procs = [context.Process(target=receiver, args=(rank + 1, orders[rank], done), daemon=True)
             for rank in range(args.receivers)]
    for proc in procs:
        proc.start()
    for _ in procs:
        assert done.get(timeout=300)[0] == "ready"
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                     timeout=datetime.timedelta(seconds=60))

    def await_loaded() -> None:
        for _ in procs:
            kind, rank = done.get(timeout=120)
            if kind != "loaded":
                raise RuntimeError(f"receiver {rank}: {kind}")

    def floor() -> None:
        for model in copies:
            for (name, tensor) in state:
                model[name].copy_(tensor)
        torch.cuda.synchronize()

    def queued() -> None:
        for order in orders:
            order.put(("tensors", state))
        await_loaded()

    def stream(device: str) -> None:
        plan = _transfer.Formation(f"gpu-{os.urandom(4).hex()}", "127.0.0.1", store.port,
                                   tuple(range(args.receivers)), "ipc", 60.0)
        tensors = state if device != "cpu" else [(n, t.cpu()) for n, t in state]
        for order in orders:
            order.put(("stream", (plan.wire(), "cuda:0")))
        sender = _transfer.join("bench-sender", plan, 0, store)
        try:
            for bucket in _transfer.buckets(tensors, dtypes, DEFAULT_BUCKET_BYTES, device):
                _transfer.send_bucket(sender, bucket, device)
            _transfer.send_end(sender, device)
        finally:
            _transfer.drop("bench-sender")
        await_loaded()

    contenders = {"floor": floor, "torch.multiprocessing": queued,
                  "ipc": lambda: stream("cuda:0"), "ipc (A/A)": lambda: stream("cuda:0"),
                  "through the host": lambda: stream("cpu")}
    for run in contenders.values():  # warm: CUDA contexts, IPC maps, the allocator
        run()
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(args.repeats):
        for name, run in contenders.items():
            torch.cuda.synchronize()
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    for order in orders:
        order.put(None)
    for proc in procs:
        proc.join(timeout=60)

    floor_s = statistics.median(times["floor"])
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}: {len(state)} tensors, "
          f"{nbytes / 2**20:.0f} MiB bfloat16, {args.receivers} receivers on GPU 0, "
          f"{args.repeats} repeats, buckets of {DEFAULT_BUCKET_BYTES // 2**20} MiB")
    results = {}
    for name, samples in times.items():
        median = statistics.median(samples)
        results[name] = {"median_s": median, "min_s": min(samples), "max_s": max(samples),
                         "vs_floor": median / floor_s}
        print(f"  {name:22} median {median * 1e3:8.1f} ms  [{min(samples) * 1e3:.1f}–"
              f"{max(samples) * 1e3:.1f}]  {median / floor_s:5.2f}x the floor  "
              f"{args.receivers * nbytes / median / 1e9:6.1f} GB/s loaded")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"device": torch.cuda.get_device_name(0), "bytes": nbytes,
                       "receivers": args.receivers, "results": results}, out, indent=1)


if __name__ == "__main__":
    main()
