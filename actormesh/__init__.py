"""actormesh: typed meshes of Ray actors with a native queue-depth-aware load balancer."""

from . import _core as _core  # first: it loads the compiled core
from . import dispatch
from ._actor import current_rank
from ._balancer import ActorLoad, Balancer, Policy
from ._bulk import get, wait
from ._errors import ActorDiedError, ActorError, MeshError, MeshTimeoutError, NoLiveActorsError
from ._future import MeshFuture, ValueMesh
from ._map import MeshMap
from ._mesh import ActorMesh, Loads
from ._method import AsyncMeshMethod, MeshMethod, method
from ._placement import Placement
from ._pool import ActorPool
from ._shape import Point, Shape
from .dispatch import Dispatch

__all__ = [
    "ActorDiedError",
    "ActorError",
    "ActorLoad",
    "ActorMesh",
    "ActorPool",
    "AsyncMeshMethod",
    "Balancer",
    "Dispatch",
    "Loads",
    "MeshError",
    "MeshFuture",
    "MeshMap",
    "MeshMethod",
    "MeshTimeoutError",
    "NoLiveActorsError",
    "Placement",
    "Point",
    "Policy",
    "Shape",
    "ValueMesh",
    "current_rank",
    "dispatch",
    "get",
    "method",
    "wait",
]
