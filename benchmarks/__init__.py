"""The actormesh benchmark harness: `python -m benchmarks [--quick | --full]` (`make bench`).

Where things are:

- `cli.py`: the command line and the order of a run; `config.py`: the sizes of each mode;
- `scenarios/`: what a run measures on Ray (`--list` names every section);
- `harness/`: how it measures: the cluster and shared actors, the contenders, the open-loop
  driver, turn taking, the metrics of a run and the results section every scenario writes;
- `report/`: the statistics (paired bootstrap, the A/A noise floor, verdicts), the headline,
  report.md, the terminal tables, the plots and the files a run writes;
- `without_ray/`: decision cost, the simulated queue and its check against queueing theory;
- `side/`: scripts of their own (`python -m benchmarks.side.<name>`), some also run by
  `python -m benchmarks` (registered in `side/__init__.py`);
- `reference.py`, `reference_heap.py`: the pure-Python twins of the native scheduler, for the
  decision cost and the differential tests.
"""
