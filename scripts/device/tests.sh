#!/usr/bin/env bash
# Runs the default test tier on the device machine (a TPU or a GPU), in one process,
# from the repository root (where the device tool runs a command; pass
# carry=[".whl-tpu"] or [".whl-gpu"]):
#
#   bash scripts/device/tests.sh                            # the whole default tier
#   bash scripts/device/tests.sh tests/devices tests/loop   # a part of it
#
# On the TPU, the tier in three calls (each within the device tool's 10 minutes; on
# 2026-12-06 the first took 237 s, the second 196-240 s, the third 236 s with
# NITRO_TEST_LIMIT=480; `env.sh test` takes 40-80 s of each call before them, on a
# machine still warm from the last call a few seconds):
#
#   bash scripts/device/tests.sh tests/agent tests/checkpoint tests/compile tests/data \
#       tests/devices tests/examples tests/experiment tests/export tests/keys
#   bash scripts/device/tests.sh tests/logging tests/loop tests/observe tests/optim \
#       tests/run
#   bash scripts/device/tests.sh tests/runfile tests/docs tests/test_*.py src/jaxnitro
#
# It sources scripts/device/env.sh test first (the test dependencies into
# .device-scratch/site-<kind>-test, from the carried wheels and on the TPU the
# machine's index), unless that folder is on PYTHONPATH already (env.sh test sourced
# earlier in the same command), and waits 5 s (the chip env.sh's version check
# opened can refuse the next process for a moment). Then `python3 -m pytest` with
# the project's addopts (`-m 'not slow and not tf and not wandb'`, strict markers,
# the doctests) and JAX_PLATFORMS=tpu,cpu or cuda,cpu: the tests run on the
# accelerator, the conftest's four fake CPU devices beside it. Arguments go to
# pytest as they are.
#
# Tests marked needs_sockets, needs_devices(n) or needs_processes are skipped there
# with the reason (no sockets, one chip, one process on it); pytest's -ra summary
# lists them. With $OUT set, the output is teed to $OUT/pytest.log and the results
# written to $OUT/junit.xml. PYTHON picks the interpreter (default python3).
#
# Time: NITRO_TEST_LIMIT seconds (default 540) go to the conftest's --time-limit: no
# test starts after them, and pytest ends as interrupted ("Interrupted: time limit
# of 540 s reached: the tests after <test> did not run", exit status 2) with its
# summary of what ran and the junit file. A SIGINT would not do it alone: a training
# test takes Ctrl+C as a request to stop its run, and pytest goes on. If one test
# runs 30 s past the limit, `timeout` sends SIGINT anyway, then SIGKILL 15 s later
# (exit status 124 or 137). Otherwise the exit status is pytest's.
set -u

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
case ":${PYTHONPATH:-}:" in
*/.device-scratch/site-*-test:*) ;;
*)
    # shellcheck source=scripts/device/env.sh
    source scripts/device/env.sh test
    ;;
esac
sleep 5
python=${PYTHON:-python3}
export JAX_PLATFORMS=${NITRO_JAX_PLATFORMS:?scripts/device/env.sh test sets it}
if [ "$NITRO_DEVICE_KIND" = gpu ]; then
    # The tests compare runs bit for bit (a resume, K steps a call against one); a
    # GPU's scatter-adds and some reductions use atomics, whose order varies from
    # run to run unless XLA is asked for deterministic ops. The four fake CPU
    # devices the conftest would ask for stay.
    export XLA_FLAGS="${XLA_FLAGS:---xla_force_host_platform_device_count=4} --xla_gpu_deterministic_ops=true"
fi
export PYTHONUNBUFFERED=1
limit=${NITRO_TEST_LIMIT:-540}

# libtpu warns at import that transparent hugepages are off (the machine's setting);
# the project's filterwarnings=error would make that warning fail every test.
args=(-m pytest "--time-limit=$limit" -W "ignore:Transparent hugepages:UserWarning")
if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    args+=("--junitxml=$OUT/junit.xml")
fi
echo "=== tests: JAX_PLATFORMS=$JAX_PLATFORMS, limit ${limit} s, pytest $*"
start=$SECONDS
run=(timeout -s INT -k 15 "$((${limit%.*} + 30))" "$python" "${args[@]}" "$@")
if [ -n "${OUT:-}" ]; then
    "${run[@]}" 2>&1 | tee "$OUT/pytest.log"
    status=${PIPESTATUS[0]}
else
    "${run[@]}"
    status=$?
fi
echo "=== tests: exit $status in $((SECONDS - start)) s"
exit "$status"
