"""`perseusctl status` against a running daemon, whole command (process start to exit); target <= 250 ms.

Starts a sim daemon (4 GPUs), then alternates runs of `perseusctl status` with runs of the bare interpreter
(`python -c pass`, the floor no command goes under) and of an interpreter that only imports pyzmq, so all
are measured under the same load. `--baseline-tree DIR` adds `python -m perseusd.ctl.main status` run from
another source tree (e.g. `git archive main | tar -x -C DIR`) beside the same command from this checkout,
both from source (PYTHONPATH), alternated with the rest.

Two installs are measured side by side: this environment's (an editable install for development, whose import
finder every Python start pays for, 30-40 ms on a slow machine) and the package as users install it: a wheel
built from this checkout and installed into a fresh virtual environment under a temporary directory with
pyzmq, the one dependency the status command needs. The target applies to the installed package. Prints
JSON with the medians, the 90th percentiles and the load average. Usage:
`python benchmarks/bench_ctl_status.py [RUNS] [--no-wheel] [--baseline-tree DIR]`.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.perseusd_proc import DaemonDirs, daemon_processes  # noqa: E402

RUNS = 20
TARGET_MS = 250.0


def _run_ms(command: list[str]) -> float:
    env = None
    if command[0].startswith("PYTHONPATH="):  # run from a source tree
        env = {**os.environ, "PYTHONPATH": command[0].removeprefix("PYTHONPATH=")}
        command = command[1:]
    began = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, cwd=tempfile.gettempdir(), env=env)
    return (time.perf_counter() - began) * 1e3


def _from_tree(tree: Path, args: list[str]) -> list[str]:
    """`perseusctl ARGS` from the source tree `tree` (its perseusd and client library first on sys.path)."""
    path = os.pathsep.join([str(tree), str(tree / "client_lib")])
    return [f"PYTHONPATH={path}", sys.executable, "-m", "perseusd.ctl.main", *args]


def _p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1] if len(values) > 1 else values[0]


def _quiet(command: list[str]) -> None:
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def _wheel_venv(scratch: Path) -> Path:
    """A fresh virtual environment with this checkout's two distributions (the client library and the
    daemon) installed from wheels; returns its bin directory."""
    wheels = scratch / "wheels"
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    for tree in (ROOT / "client_lib", ROOT):
        _quiet([*pip_wheel, "-w", str(wheels), str(tree)])
    venv = scratch / "venv"
    _quiet([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    site = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    install = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", site]
    _quiet([*install, *map(str, wheels.glob("*.whl")), f"pyzmq=={version('pyzmq')}"])
    # --target does not write the console scripts for another interpreter: the entry point is this line.
    ctl = venv / "bin" / "perseusctl"
    entry = "import sys\nfrom perseusd.ctl.main import main\nsys.exit(main())\n"
    ctl.write_text(f"#!{venv / 'bin' / 'python'}\n{entry}")
    ctl.chmod(0o755)
    return venv / "bin"


def main() -> None:
    argv = sys.argv[1:]
    baseline = None
    if "--baseline-tree" in argv:
        at = argv.index("--baseline-tree")
        baseline = Path(argv[at + 1]).resolve()
        del argv[at : at + 2]
    args = [arg for arg in argv if not arg.startswith("--")]
    runs = int(args[0]) if args else RUNS
    with tempfile.TemporaryDirectory() as scratch, daemon_processes() as make:
        commands: dict[str, list[str]] = {}
        daemon = make(DaemonDirs.create(), gpus=4).start()
        status_args = ["--runtime-dir", str(daemon.dirs.runtime_dir), "status"]
        if baseline is not None:
            commands["tree_status_ms"] = _from_tree(ROOT, status_args)
            commands["baseline_tree_status_ms"] = _from_tree(baseline, status_args)
        if "--no-wheel" not in argv:
            wheel_bin = _wheel_venv(Path(scratch))
            commands["installed_status_ms"] = [str(wheel_bin / "perseusctl"), *status_args]
            commands["installed_python_pass_ms"] = [str(wheel_bin / "python"), "-c", "pass"]
        commands["dev_status_ms"] = [str(Path(sys.executable).with_name("perseusctl")), *status_args]
        commands["dev_python_pass_ms"] = [sys.executable, "-c", "pass"]
        commands["dev_python_import_zmq_ms"] = [sys.executable, "-c", "import zmq"]
        for command in commands.values():
            _run_ms(command)  # warm the page cache (and check that each command works)
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(runs):
            for name, command in commands.items():
                times[name].append(_run_ms(command))
    result = {
        "benchmark": "ctl_status",
        "runs": runs,
        **{f"median_{name}": round(statistics.median(values), 1) for name, values in times.items()},
        **{f"p90_{name}": round(_p90(values), 1) for name, values in times.items() if "status" in name},
        **{f"min_{name}": round(min(values), 1) for name, values in times.items() if "status" in name},
        "target_ms": TARGET_MS,
        "load_average_1m": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
