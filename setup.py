"""Build the optional C core of the frontier solver; everything else is declared in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "perseusd.planner._pdcore",
            ["perseusd/planner/_pdcore.c"],
            # No contraction into fused multiply-adds: results must match the Python reference bit for bit.
            extra_compile_args=["-O2", "-ffp-contract=off", "-std=c11"],
            optional=True,
        )
    ]
)
