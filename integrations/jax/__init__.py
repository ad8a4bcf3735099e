"""Multi-process JAX over a mesh of Ray actors: `JaxMesh`, and `checkpoint` for one-writer saves.

```python
from actormesh.integrations.jax import JaxMesh, checkpoint

with JaxMesh(Trainer, 2, platforms="cpu", num_cpus=1) as mesh:
    mesh.wait_ready()                             # every process has joined jax.distributed
    losses = mesh.methods.step.all(batch).get()   # the batch is put in the object store once
```

Inside the actors, `jax.process_index()` is the actor's rank and `checkpoint.save(path, data)`
writes once per file system.
"""

from .._options import MeshOptions
from . import checkpoint
from ._coordinator import PORT_ENV
from ._mesh import DIM, JaxMesh

__all__ = ["DIM", "PORT_ENV", "JaxMesh", "MeshOptions", "checkpoint"]
