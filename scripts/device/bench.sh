#!/usr/bin/env bash
# Runs benchmarks one after another on the device machine (a TPU or a GPU), from the
# repository root, after `source scripts/device/env.sh runtime`:
#
#   bash scripts/device/bench.sh "steps_per_call.py --reps 5" "throughput.py --quick"
#
# Each argument is a script in benchmarks/ with its flags. The scripts run one at a
# time, never two at once (only one process can open a TPU chip, and two would share
# a GPU; throughput.py and first_step.py start their own children one at a time), each with PYTHONUNBUFFERED=1,
# 5 seconds apart (a chip just let go can refuse the next process for a moment). With
# $OUT set, each script's output (stdout and stderr) is teed to $OUT/<script>.log
# (`throughput.log`; `throughput-2.log` for a second run of it). After each script, and
# again at the end, one line: its exit status and seconds. A failing script does not
# stop the others; the whole exits 1 if any failed.
#
# Needs beyond `env.sh runtime`: runfile.py wants flax, precision.py flax, grain and
# scikit-learn: `source scripts/device/env.sh test` with .whl-tpu or .whl-gpu
# carried (grain is on neither machine). prefetch.py leaves its Grain row out without grain.
# data_parallel.py runs on the host's CPU there (it forces 4 CPU devices for itself).
# The device tool brings back at most 8 files from $OUT: 8 scripts a call at most.
# PYTHON picks the interpreter (default python3).
set -u

if [ $# -eq 0 ]; then
    echo "usage: bash scripts/device/bench.sh \"SCRIPT.py [FLAGS]\" ..." >&2
    exit 2
fi
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
python=${PYTHON:-python3}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

summary=()
failed=0
first=1
for spec in "$@"; do
    read -r -a words <<<"$spec"
    script=${words[0]}
    name=$(basename "$script" .py)
    logdir=${OUT:-$scratch}
    log=$logdir/$name.log
    n=1
    while [ -e "$log" ]; do
        n=$((n + 1))
        log=$logdir/$name-$n.log
    done
    [ $first -eq 1 ] || sleep 5
    first=0
    echo "=== bench: $spec"
    start=$SECONDS
    PYTHONUNBUFFERED=1 "$python" "benchmarks/$script" "${words[@]:1}" 2>&1 | tee "$log"
    status=${PIPESTATUS[0]}
    seconds=$((SECONDS - start))
    if [ "$status" -eq 0 ]; then
        line="ok     exit 0 $(printf '%5d' "$seconds") s  $spec"
    else
        failed=1
        last=$(grep -v '^\s*$' "$log" | tail -n 1 | cut -c1-160)
        line="FAILED exit $status $(printf '%5d' "$seconds") s  $spec  ($last)"
    fi
    echo "=== bench: $line"
    summary+=("$line")
done

echo "=== bench summary"
printf '%s\n' "${summary[@]}"
exit $failed
