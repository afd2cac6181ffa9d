#!/usr/bin/env bash
# The main job: plan GPT-3 175B on the bundled, measured A100 SXM profile (8 stages, 12 microbatches),
# then compare the plan's energy with all-max and the baselines, with and without a straggler.
# Output lands in out/demo (frontier.csv, frontier.json with every plan, frontier.png).
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
out=out/demo
mkdir -p "$out"
echo "== perseusctl solve: the iteration time-energy frontier"
perseusctl solve --profile a100_sxm --stages 8 --microbatches 12 --out "$out" --plot "$out/frontier.png"
echo
echo "== perseusctl compare: energy saved against all-max clocks"
perseusctl compare --profile a100_sxm --stages 8 --microbatches 12 --plot "$out/compare.png"
