"""Shut this process's TCP connections of a broken world, so that a thread blocked in one of its gloo operations gets
out at once (docs/elastic/recovery.md, "Detection").

torch 2.13's ProcessGroupGloo has no abort of its own (`Backend::abort` and `shutdown` are no-ops for gloo; only a
pending send or receive `Work` can be aborted, and a collective's cannot), and a collective waits for a peer that is
alive but has left it (busy recovering) until the group's timeout. A lost peer surfaces as "Connection closed by peer"
on gloo: shutting the connections ourselves makes every pending operation of the old world fail that way. The job's
store (MASTER_PORT) is kept: the new world meets there.
"""
from __future__ import annotations

import os
import socket
from pathlib import Path

ESTABLISHED = "01"


def _connections(table: Path) -> dict[int, tuple[int, int]]:
    """inode -> (local port, remote port) of the established connections in /proc/net/tcp or tcp6."""
    out = {}
    try:
        lines = table.read_text().splitlines()[1:]
    except OSError:
        return out
    for line in lines:
        fields = line.split()
        if len(fields) > 9 and fields[3] == ESTABLISHED:
            local, remote = (int(a.rsplit(":", 1)[1], 16) for a in (fields[1], fields[2]))
            out[int(fields[9])] = (local, remote)
    return out


def shut_connections(keep_ports: set[int]) -> int:
    """shutdown(SHUT_RDWR) every established TCP connection of this process that touches none of `keep_ports` (the
    file descriptors stay open: their owners close them); how many were shut."""
    conns = {**_connections(Path("/proc/self/net/tcp")), **_connections(Path("/proc/self/net/tcp6"))}
    shut = 0
    for fd_path in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd_path)
        except OSError:
            continue
        if not target.startswith("socket:["):
            continue
        ports = conns.get(int(target[8:-1]))
        if ports is None or keep_ports & set(ports):
            continue
        try:
            sock = socket.socket(fileno=int(fd_path.name))
        except OSError:  # closed since it was listed (gloo closes a pair whose peer is gone)
            continue
        try:
            sock.shutdown(socket.SHUT_RDWR)
            shut += 1
        except OSError:
            pass
        finally:
            sock.detach()  # the descriptor stays gloo's
    return shut
