"""A pool of model replicas behind `choose`: least-loaded routing, sticky sessions, retries.

Each replica serves one request at a time (a sync actor); `max_in_flight=2` keeps one request
waiting at each replica and the rest in the native queue, so a slow replica never hoards work.
"""

import random
import time

import ray

import actormesh as am


class Replica:
    def __init__(self, slow_rank: int) -> None:
        # One straggler replica, 10x slower: the balancer should route around it.
        self.delay = 0.02 if am.current_rank().rank == slow_rank else 0.002

    @am.method
    def generate(self, prompt: str) -> str:
        time.sleep(self.delay * random.uniform(0.5, 1.5))
        return f"rank {am.current_rank().rank}: {prompt[::-1]}"


if __name__ == "__main__":
    ray.init()
    policy = am.Policy("sed", max_in_flight=2)
    with am.ActorMesh(Replica, shape=4, args=(0,), num_cpus=0.25, balancer=policy) as pool:
        pool.wait_ready()
        start = time.perf_counter()
        futures = [pool.methods.generate.options(retries=2).choose(f"prompt {i}") for i in range(400)]
        served_by = [f.get().split(":")[0] for f in futures]
        print(f"400 requests in {time.perf_counter() - start:.2f} s")
        for rank in range(4):
            print(f"rank {rank} served {served_by.count(f'rank {rank}')}")
        chat = pool.methods.generate.options(affinity="session-42")
        print({chat.choose("hello").get().split(":")[0] for _ in range(5)})  # one replica
