"""The actormesh benchmark harness: `python -m benchmarks [--quick | --full]` (see __main__)."""
