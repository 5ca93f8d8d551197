"""Cost model: a cluster description turns a schedule into a predicted wall time.

Per round, every rank's sends and receives run concurrently; intra-node traffic uses the device's
NVLink-class bandwidth, inter-node traffic its share of the NICs, each direction separately (full
duplex).  A round lasts as long as its slowest rank plus one latency; rounds run back to back.
Local copies run first at device memory bandwidth.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .schedule import Schedule


@dataclass(frozen=True)
class Cluster:
    nodes: int
    devices_per_node: int
    intra_node_gbps: float  # GB/s per device, one direction (e.g. NVLink 4: ~360 achievable)
    inter_node_gbps: float  # GB/s per device, one direction (a 200 Gb/s NIC per GPU: 25)
    intra_latency_s: float = 5e-6
    inter_latency_s: float = 10e-6
    copy_gbps: float = 1000.0  # device-local copy bandwidth

    @property
    def world_size(self) -> int:
        return self.nodes * self.devices_per_node

    @staticmethod
    def h100_nodes(nodes: int) -> "Cluster":
        """The paper's setting: 8 GPUs per node on NVLink, 8 x 200 Gb/s NICs per node."""
        return Cluster(nodes, 8, intra_node_gbps=360.0, inter_node_gbps=25.0)


def predict_seconds(schedule: Schedule, cluster: Cluster) -> float:
    w, rpn = schedule.plan.world_size, cluster.devices_per_node
    node = np.arange(w) // rpn
    total = local_copy_seconds(schedule, cluster)
    for i in range(schedule.num_rounds):
        s, d, b = schedule.round_pairs(i)
        inter = node[s] != node[d]
        times = []
        for mask, gbps in ((~inter, cluster.intra_node_gbps), (inter, cluster.inter_node_gbps)):
            out = np.bincount(s[mask], b[mask], minlength=w)
            inn = np.bincount(d[mask], b[mask], minlength=w)
            times.append(max(out.max(initial=0), inn.max(initial=0)) / (gbps * 1e9))
        latency = cluster.inter_latency_s if inter.any() else cluster.intra_latency_s
        total += max(times) + latency
    return total


def local_copy_seconds(schedule: Schedule, cluster: Cluster) -> float:
    w = schedule.plan.world_size
    per_rank = np.zeros(w)
    for c in schedule.plan.classes:
        np.add.at(per_rank, c.copy_rank, c.vol[c.copy_region] * float(c.weight))
    return float(per_rank.max(initial=0)) / (cluster.copy_gbps * 1e9)
