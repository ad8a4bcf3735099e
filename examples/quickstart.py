"""The README example: a 2x2 mesh, its three verbs, and a view."""

import ray

import actormesh as am


class Worker:
    @am.method
    def f(self, x: int) -> int:
        return x * 2

    @am.method(dispatch=am.dispatch.split())
    def process(self, xs: list[int], y: int) -> list[int]:
        return [x + y for x in xs]


if __name__ == "__main__":
    ray.init()  # a local cluster; ray.init(address="auto") joins a running one
    with am.ActorMesh(Worker, shape={"dp": 2, "tp": 2}, num_cpus=0.5) as mesh:
        print(list(mesh.methods.f.all(1).get()))  # [2, 2, 2, 2]: every actor
        print(mesh.methods.f.choose(1).get())  # 2: from a free actor
        print(mesh.methods.process.shard([1, 2, 3, 4], 5).get())  # [6, 7, 8, 9]: split, joined
        print(list(mesh.slice(dp=1).methods.f.all(2).get()))  # [4, 4]: a view over dp=1
