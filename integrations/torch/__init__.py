"""`torch.distributed` over meshes of Ray actors: `TorchMesh`, `process_group`, `link`.

```python
from actormesh.integrations.torch import TorchMesh, link, process_group

with TorchMesh(Trainer, {"dp": 2, "tp": 2}, num_cpus=1) as trainer:   # one gloo world of 4
    trainer.methods.step.all(batch).get()       # inside: dist.all_reduce(t, group=process_group("dp"))
    weights = link(trainer[0, 0], engines, name="weights")   # trainer rank 0 + every engine
```

Inside the actors, the torchrun variables are set and `init_process_group` has returned before
`__init__` runs; `process_group(dim)` is the group along a dim, `process_group(link_name)` a
link's group, and `current_world()` the actor's place in its world. `torch` is imported only
where it is used: the driver of a `TorchMesh` does not need it.
"""

from .._options import MeshOptions
from ._groups import TorchWorld, current_world, process_group
from ._link import Link, link
from ._mesh import TorchMesh

__all__ = ["Link", "MeshOptions", "TorchMesh", "TorchWorld", "current_world", "link",
           "process_group"]
