"""Frontier plots for `perseusctl solve --plot` and `perseusctl compare --plot`.

matplotlib is imported only when a plot is drawn, and only its object-oriented API with the Agg canvas is
used (no pyplot, no global backend switch), so importing this module costs nothing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from perseusd.errors import PerseusError

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

TimeEnergy = tuple[float, float]
"""A point as (time_s, energy_j)."""


def new_axes(
    title: str, xlabel: str = "iteration time (s)", ylabel: str = "iteration energy (J)"
) -> tuple[Figure, Axes]:
    """A figure on the Agg canvas with one gridded, labelled axes (every plot of perseusctl starts here)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise PerseusError("plots need matplotlib: pip install 'perseusd[plot]'") from exc
    figure = Figure(figsize=(7.0, 4.5), dpi=120)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    axes.set_title(title)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(True, alpha=0.3)
    return figure, axes


def save_figure(figure: Figure, path: str | os.PathLike[str]) -> None:
    figure.tight_layout()
    figure.savefig(os.fspath(path))


def plot_frontier(
    points: Sequence[TimeEnergy],
    path: str | os.PathLike[str],
    title: str = "Perseus iteration time-energy frontier",
    all_max: TimeEnergy | None = None,
) -> None:
    """Draw one frontier (and the all-max point) to an image file (format from the extension, e.g. PNG)."""
    figure, axes = new_axes(title)
    times_s, energies_j = [p[0] for p in points], [p[1] for p in points]
    axes.plot(times_s, energies_j, "-", lw=1.5, label="Perseus frontier")
    if all_max is not None:
        axes.plot([all_max[0]], [all_max[1]], "k*", ms=10, label="all-max")
    axes.legend()
    save_figure(figure, path)


def plot_comparison(
    series: Mapping[str, Sequence[TimeEnergy]],
    path: str | os.PathLike[str],
    title: str = "Planners on the same profile",
    all_max: TimeEnergy | None = None,
) -> None:
    """Draw several planners' points on one chart: lines for point sets, markers for single plans."""
    figure, axes = new_axes(title)
    for name, points in series.items():
        style = "o" if len(points) == 1 else ".-"
        times_s, energies_j = [p[0] for p in points], [p[1] for p in points]
        axes.plot(times_s, energies_j, style, ms=4, lw=1.2, label=name)
    if all_max is not None:
        axes.plot([all_max[0]], [all_max[1]], "k*", ms=10, label="all-max")
    axes.legend()
    save_figure(figure, path)
