"""Reading Ray's Prometheus endpoint: the session cluster exports on a port of its own
(`_metrics_export_port`, the `metrics_port` fixture) through Ray's metrics agent, which needs
Ray's `default` extra (`pip install actormesh[metrics]`)."""

from __future__ import annotations

import socket
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def scrape(port: int, *parts: str) -> list[str]:
    """The lines of Ray's Prometheus page that hold every one of `parts`."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as page:
        text: str = page.read().decode()
    return [line for line in text.splitlines() if all(p in line for p in parts)]
