"""Losing a whole node: calls on its actors fail cleanly, the rest of the mesh keeps working."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from workers import TESTS, script_env


def test_node_loss_fails_its_actors_calls_and_the_rest_keep_working() -> None:
    run = subprocess.run([sys.executable, os.path.join(TESTS, "node_loss.py")],
                         env=script_env(), capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    nodes = seen["node_of_rank"]
    assert nodes[0] == nodes[1] and nodes[2] == nodes[3] and nodes[0] != nodes[2]  # ranks by node
    lost = seen["lost_ranks"]
    assert len(lost) == 2
    for rank in lost:
        assert seen["errors"][str(rank)] == [rank, {"rank": rank}]
    assert seen["alive"] == [r not in lost for r in range(4)]
    assert seen["picks"] == sorted(set(range(4)) - set(lost))
    assert seen["load"] == [0, 0, 0, 0]
