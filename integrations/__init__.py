"""Integrations built on the core ActorMesh: installed as `actormesh.integrations`."""
