#!/usr/bin/env bash
# Set up a fresh machine: a virtual environment in .venv with the project's two distributions installed
# (editable), both from this repository: the client library (`client_lib/`, perseusd-client) and the daemon
# (the root, perseusd), which depends on it.
#   scripts/setup.sh         what the main job needs
#   scripts/setup.sh --dev   plus what the tests need: development tools and, when run as root, the Debian
#                            packages of the service, cluster, container and Slurm tests (systemd-nspawn,
#                            debootstrap, etcd, podman, Slurm)
set -euo pipefail
cd "$(dirname "$0")/.."
dev=0
[ "${1:-}" = "--dev" ] && dev=1

if [ "$dev" = 1 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  need=()
  # systemd: systemd-analyze (unit checks); procps: /bin/kill (the unit's ExecReload=); prometheus: promtool
  # (the metrics test checks the exposition with `promtool check metrics`); podman, runc: the container
  # tests (runc: crun refuses hosts with cgroup controllers in both hierarchies); slurmctld, slurmd,
  # slurm-client, munge: the Slurm tests start a one-node cluster.
  for pkg in etcd-server etcd-client systemd systemd-container debootstrap libsystemd-dev pkg-config procps prometheus \
    podman runc slurmctld slurmd slurm-client munge; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
  done
  if [ "${#need[@]}" -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
fi

python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
if [ "$dev" = 1 ]; then
  python -m pip install -q -e ./client_lib -e '.[dev]'
  # The framework integrations' tests, against the pinned torch (never a second one): DeepSpeed is an sdist
  # that imports torch to build (no build isolation, no compiled ops); torchtitan is installed without its
  # training-stack dependencies (datasets, wandb, ...): the tests use its pipeline builder only.
  python -m pip install -q setuptools wheel
  DS_BUILD_OPS=0 python -m pip install -q --no-build-isolation deepspeed==0.19.8 torch==2.13.0
  python -m pip install -q spmd_types==0.2.3 tyro==1.0.17 torch==2.13.0
  python -m pip install -q --no-deps torchtitan==0.3.0
  # Journal logging and sd_notify through systemd-python where it builds (needs libsystemd-dev).
  python -m pip install -q systemd-python || echo "setup: systemd-python not installed; perseusd uses its own notify"
else
  python -m pip install -q -e ./client_lib -e '.[plot]'
fi
echo "setup: ready (.venv)"
