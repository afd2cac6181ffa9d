"""The planner's compiled cores (`_pdcore`, `_switchcore`), loaded only when built from these sources.

Each C module states its interface version as `ABI`; a module built from other sources (a checkout pulled
without rebuilding, `python setup.py build_ext --inplace`) would fail mid-solve with a `TypeError` on the
first changed signature, so it is refused at import, with a warning, and the planner runs its Python
implementations (the same figures, slower).
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

logger = logging.getLogger(__name__)

ABI = {"_pdcore": 1, "_switchcore": 4}
"""The interface version each core must state (its C source's `*_ABI`)."""


def load_core(name: str) -> Any | None:
    """`perseusd.planner.<name>` when it was built and states this code's interface version, else None."""
    try:
        module = importlib.import_module(f"perseusd.planner.{name}")
    except ImportError:
        return None
    return checked(module, name)


def checked(module: Any, name: str) -> Any | None:
    """`module` when its `ABI` is the one `name` must state; None (logged) otherwise."""
    found = getattr(module, "ABI", None)
    if found == ABI[name]:
        return module
    logger.warning(
        "perseusd.planner.%s was built from other sources (interface %s, this code needs %s): using the "
        "Python implementation; rebuild it (python setup.py build_ext --inplace, or reinstall perseusd)",
        name,
        found,
        ABI[name],
    )
    return None
