"""vLLM engines on an ActorMesh (see the pool's module for the API)."""
