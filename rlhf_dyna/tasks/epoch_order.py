"""A walk over a dataset's rows in a fresh seeded permutation per epoch, resumable from its state: the training order
of the file-backed tasks (`task=file`, `task=preference`)."""
from __future__ import annotations

import random
from typing import Any


class EpochOrder:
    def __init__(self, size: int, seed: int, task: str, unit: str) -> None:
        self.size, self.seed = size, seed
        self.task, self.unit = task, unit  # for the state's count key and the resume message: "file", "rows"
        self.epoch, self.index = 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(self.size))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def take(self, count: int) -> list[int]:
        """The next `count` row indices of this epoch's order, into the next epoch when it runs out."""
        out: list[int] = []
        while len(out) < count:
            if self.index == len(self._order):
                self.epoch, self.index = self.epoch + 1, 0
                self._order = self._permutation(self.epoch)
            out.append(self._order[self.index])
            self.index += 1
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "index": self.index, "seed": self.seed, f"num_{self.unit}": self.size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state.get(f"num_{self.unit}", self.size)
        if state.get("seed", self.seed) != self.seed or saved != self.size:
            raise ValueError(
                f"task={self.task} position {state} was saved for seed={state.get('seed')} and {saved} {self.unit}, "
                f"but this run has seed={self.seed} and {self.size} {self.unit}; resume with the same data and "
                "trainer.seed.")
        self.epoch, self.index = int(state["epoch"]), int(state["index"])
        self._order = self._permutation(self.epoch)
