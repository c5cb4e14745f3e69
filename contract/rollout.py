"""How many units roll at once, and how that budget splits into units per cell and cells at once.

One pure rule shared by the stacks (which turn it into CloudFormation DependsOn and stack
dependencies), `flotilla plan` (which recommends a wave size) and the operations CLI (rollbacks in
waves). Standard library only, like the rest of contract/.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# A rollout takes about a tenth of the fleet out of its steady state at once (replace: out of
# rotation; surge: doubled on spare instances).
DEFAULT_WAVE_FRACTION = 0.1


def default_units_per_wave(units: int) -> int:
    """About 10 % of the fleet, at least one unit."""
    if units < 1:
        raise ValueError(f"units={units}: a fleet has at least one unit")
    return max(1, math.ceil(units * DEFAULT_WAVE_FRACTION - 1e-9))


@dataclass(frozen=True)
class WavePlan:
    """A rollout budget of `units_per_wave` units, laid out on cells of at most `units_per_cell`.

    Inside a cell stack, units roll `wave_in_cell` at a time (each unit's service waits for every
    service of the cell's previous wave). Cells roll `parallel_cells` at a time: cell c waits for
    cell c - parallel_cells, so `cdk deploy --concurrency parallel_cells` (or more) lets that many
    lanes of cells proceed side by side. wave_in_cell x parallel_cells never exceeds units_per_wave.
    """

    units: int
    units_per_cell: int
    units_per_wave: int
    wave_in_cell: int
    parallel_cells: int

    @property
    def cells(self) -> int:
        return math.ceil(self.units / self.units_per_cell)

    def units_in_cell(self, cell: int) -> int:
        return max(0, min(self.units_per_cell, self.units - cell * self.units_per_cell))

    def cell_waves(self, cell: int) -> int:
        """Sequential waves inside one cell."""
        return math.ceil(self.units_in_cell(cell) / self.wave_in_cell)

    def wave_of(self, index_in_cell: int) -> int:
        """The in-cell wave (0, 1, ...) of the unit at this index of its cell."""
        return index_in_cell // self.wave_in_cell

    def cell_after(self, cell: int) -> int | None:
        """The cell this cell's stack waits for (None: it starts with the deploy)."""
        return cell - self.parallel_cells if cell >= self.parallel_cells else None

    @property
    def sequential_waves(self) -> int:
        """Waves one after another when every lane runs in parallel: the longest lane's total."""
        lanes = [0] * self.parallel_cells
        for cell in range(self.cells):
            lanes[cell % self.parallel_cells] += self.cell_waves(cell)
        return max(lanes)

    @property
    def serial_waves(self) -> int:
        """Waves one after another with `cdk deploy --concurrency 1` (one cell stack at a time)."""
        return sum(self.cell_waves(cell) for cell in range(self.cells))

    @property
    def most_units_at_once(self) -> int:
        return self.wave_in_cell * self.parallel_cells


def plan_waves(units: int, units_per_cell: int, units_per_wave: int | None = None) -> WavePlan:
    """The layout of a wave budget (default: default_units_per_wave) with the fewest sequential
    waves; among equals, the fewest cells at once (fewer concurrent stack deployments)."""
    if units < 1 or units_per_cell < 1:
        raise ValueError(f"units={units}, units_per_cell={units_per_cell}: both must be at least 1")
    budget = default_units_per_wave(units) if units_per_wave is None else units_per_wave
    if not 1 <= budget <= units:
        raise ValueError(f"units_per_wave={budget}: allowed 1 to units ({units})")
    cells = math.ceil(units / units_per_cell)
    best: WavePlan | None = None
    for wave_in_cell in range(1, min(budget, units_per_cell) + 1):
        candidate = WavePlan(
            units=units,
            units_per_cell=units_per_cell,
            units_per_wave=budget,
            wave_in_cell=wave_in_cell,
            parallel_cells=min(cells, budget // wave_in_cell),
        )
        key = (candidate.sequential_waves, candidate.parallel_cells)
        if best is None or key < (best.sequential_waves, best.parallel_cells):
            best = candidate
    assert best is not None  # the range holds wave_in_cell=1 at least
    return best
