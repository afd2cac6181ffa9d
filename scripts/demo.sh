#!/usr/bin/env bash
# The main job: GPT-3 175B (8 stages, 12 microbatches) on 8 simulated A100s, end to end.
#   1. plan offline: the time-energy frontier of the bundled, measured A100 profile and the saving it promises;
#   2. run the closed loop: perseusd on simulated GPUs, an emulated training job (one process per stage) that
#      first runs at all-max clocks (the baseline), then registers: the daemon profiles it online, solves the
#      frontier and switches clocks per computation; the job measures the energy saved from the GPUs' counters.
# Outputs land in out/demo: frontier.csv/json/png (offline), emulate.txt/json, jobs.txt, plan.txt, perseusd.log.
# Extra perseus-emulate arguments can be given in PERSEUS_DEMO_ARGS (e.g. "--time-scale 1.0": real time,
# then also set PERSEUSD_SIM_UPDATE_PERIOD_S=0.1).
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
out="$PWD/out/demo"
mkdir -p "$out"

echo "== perseusctl solve: the iteration time-energy frontier (offline)"
perseusctl solve --profile a100_sxm --stages 8 --microbatches 12 --out "$out" --plot "$out/frontier.png"
echo

# A fresh daemon state each run: a cached frontier would skip the online profiling this demo shows.
run="$out/run"
state="$out/state"
if [ "${#run}" -gt 90 ]; then  # unix socket paths are limited to 107 bytes
  run="$(mktemp -d /tmp/perseus-demo.XXXXXX)/run"
fi
rm -rf "$run" "$state"
echo "== perseusd --backend sim: 8 simulated A100 SXM GPUs (runtime dir $run)"
# The whole world runs 4x faster (perseus-emulate --time-scale 0.25 below): the simulated energy counters
# update every 25 ms instead of 100 ms, so online profiling needs as many iterations as in real time.
PERSEUSD_SIM_UPDATE_PERIOD_S="${PERSEUSD_SIM_UPDATE_PERIOD_S:-0.025}" \
  perseusd --backend sim --sim-gpus 8 --sim-model a100_sxm --runtime-dir "$run" --state-dir "$state" \
  --log-level INFO >"$out/perseusd.log" 2>&1 &
daemon=$!
stop_daemon() {
  if kill -0 "$daemon" 2>/dev/null; then
    kill -TERM "$daemon"
    wait "$daemon" || true
  fi
}
trap stop_daemon EXIT
for _ in $(seq 300); do
  if [ -S "$run/control.sock" ] && perseusctl --runtime-dir "$run" status >/dev/null 2>&1; then
    break
  fi
  kill -0 "$daemon" 2>/dev/null || { cat "$out/perseusd.log"; echo "demo: perseusd exited" >&2; exit 1; }
  sleep 0.1
done
perseusctl --runtime-dir "$run" status >/dev/null
echo

echo "== perseus-emulate: baseline at all-max clocks, then the daemon's closed loop"
# Time scale 0.25: an iteration takes ~0.7 s instead of 2.8 s; online profiling takes about 70 iterations.
# shellcheck disable=SC2086  # PERSEUS_DEMO_ARGS is a list of arguments
perseus-emulate --profile a100_sxm --stages 8 --microbatches 12 --iterations 10 --time-scale 0.25 \
  --job demo-gpt3 --runtime-dir "$run" --json-file "$out/emulate.json" ${PERSEUS_DEMO_ARGS:-} \
  | tee "$out/emulate.txt"
echo

for cmd in jobs plan; do
  if perseusctl "$cmd" --help >/dev/null 2>&1; then
    echo "== perseusctl $cmd"
    args=("$cmd")
    [ "$cmd" = plan ] && args+=(demo-gpt3)
    perseusctl --runtime-dir "$run" "${args[@]}" | tee "$out/$cmd.txt" || true
    echo
  fi
done

stop_daemon
trap - EXIT
echo "demo: outputs in $out"
