"""Per-rank geometry of the layer step (docs/design.md §1).

A TP rank holds ``heads = n_heads / tp`` consecutive query heads and
``groups = o_groups / tp`` whole wo_a groups; everything a kernel sizes itself
by is a property of ``Dims`` (values at dsv41-flash, tp 4, in comments).
"""

from __future__ import annotations

import dataclasses

from dsv41.config import ModelConfig, load_model_config

TP_SIZES = (1, 2, 4, 8)
HEAD_TILE = 16  # heads one attention program covers


@dataclasses.dataclass(frozen=True)
class Dims:
    tp: int
    model: ModelConfig

    def __post_init__(self):
        m = self.model
        if self.tp not in TP_SIZES:
            raise ValueError(f"tp: expected one of {TP_SIZES}, got {self.tp}")
        if m.o_groups % self.tp:
            raise ValueError(
                f"tp: {self.tp} does not divide model {m.name!r}: {m.n_heads} heads in "
                f"{m.o_groups} groups of {m.heads_per_group} would split a group across ranks"
            )

    @classmethod
    def of(cls, model: str | ModelConfig, tp: int) -> Dims:
        """Dims for a config name or object."""
        return cls(tp, model if isinstance(model, ModelConfig) else load_model_config(model))

    @property
    def heads(self) -> int:
        """Query heads on this rank: n_heads / tp (16)."""
        return self.model.n_heads // self.tp

    @property
    def head_tiles(self) -> int:
        """Tiles of 16 heads covering this rank's heads, the last possibly partial (1)."""
        return -(-self.heads // HEAD_TILE)

    @property
    def groups(self) -> int:
        """wo_a groups on this rank: o_groups / tp (2)."""
        return self.model.o_groups // self.tp

    @property
    def group_k(self) -> int:
        """Inputs of one wo_a group: heads_per_group * head_dim (4096)."""
        return self.model.heads_per_group * self.model.head_dim

    @property
    def q_rows(self) -> int:
        """Rows of this rank's wq_b: heads * head_dim (8192)."""
        return self.heads * self.model.head_dim

    @property
    def o_rows(self) -> int:
        """Rows of this rank's wo_a: groups * o_rank (2048)."""
        return self.groups * self.model.o_rank

    def head_range(self, rank: int) -> range:
        """Global indices of the heads rank ``rank`` holds."""
        self._check_rank(rank)
        return range(rank * self.heads, (rank + 1) * self.heads)

    def group_range(self, rank: int) -> range:
        """Global indices of the wo_a groups rank ``rank`` holds."""
        self._check_rank(rank)
        return range(rank * self.groups, (rank + 1) * self.groups)

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.tp:
            raise ValueError(f"rank: expected 0 <= rank < tp = {self.tp}, got {rank}")
