"""Build the optional C cores of the frontier solver and of plan following and the switch-aware descent (each
file's header says what it saves, measured); everything else is declared in pyproject.toml."""

from setuptools import Extension, setup

# No contraction into fused multiply-adds: results must match the Python references bit for bit.
C_FLAGS = ["-O2", "-ffp-contract=off", "-std=c11"]
# Included by both cores: a change rebuilds them, and the source distribution carries it.
SHARED_HEADER = "perseusd/planner/_cshared.h"

setup(
    ext_modules=[
        Extension(
            "perseusd.planner._pdcore",
            ["perseusd/planner/_pdcore.c"],
            depends=[SHARED_HEADER],
            extra_compile_args=C_FLAGS,
            optional=True,
        ),
        Extension(
            "perseusd.planner._switchcore",
            ["perseusd/planner/_switchcore.c"],
            depends=[SHARED_HEADER],
            extra_compile_args=C_FLAGS,
            optional=True,
        ),
    ]
)
