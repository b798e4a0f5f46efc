"""What the processes of a live benchmark cost, read from Linux ``/proc``: the process
table, a process with its descendants (a gateway's workers), CPU seconds per role and of
the whole machine, and resident memory."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping
from pathlib import Path


def process_table() -> dict[int, tuple[int, int]]:
    """pid → (parent pid, CPU ticks used so far) of every process on the machine."""
    table: dict[int, tuple[int, int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        table[int(entry.name)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
    return table


def process_tree(pid: int, table: Mapping[int, tuple[int, int]]) -> list[int]:
    """``pid`` and its descendants in ``table`` (from ``process_table``)."""
    tree, found = [pid], []
    while tree:
        member = tree.pop()
        found.append(member)
        tree += [child for child, (parent, _) in table.items() if parent == member]
    return found


def cpu_seconds(pids: Mapping[str, int]) -> dict[str, float]:
    """CPU seconds (user + system) used so far by each process with its descendants (a
    gateway's worker processes), by this one as ``client``, and by the whole machine as
    ``machine`` (every process, ours or not)."""
    tick = os.sysconf("SC_CLK_TCK")
    used = {"client": time.process_time()}
    table = process_table()
    for role, pid in pids.items():
        if pid in table:
            used[role] = sum(table[member][1] for member in process_tree(pid, table)) / tick
    try:
        ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        used["machine"] = (sum(ticks[:8]) - ticks[3] - ticks[4]) / tick  # all but idle, iowait
    except (OSError, ValueError, IndexError):
        pass
    return used


def memory_mb(pid: int) -> tuple[float, float]:
    """``VmRSS`` and ``VmHWM`` (MB) of ``pid``, summed with its descendants'."""
    rss = peak = 0
    for member in process_tree(pid, process_table()):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{member}/status").read_text().splitlines():
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    kb = int(value.split()[0])
                    rss, peak = (rss + kb, peak) if key == "VmRSS" else (rss, peak + kb)
    return rss / 1024, peak / 1024
