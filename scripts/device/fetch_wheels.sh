#!/usr/bin/env bash
# Run HERE (a machine with internet), from the repository root: downloads into .whl-tpu/
# the wheels the TPU machine's own package index lacks (grain and equinox with their
# missing needs, pyte), for Python 3.11 on x86-64. `.whl-tpu/` is git-ignored locally
# (`echo /.whl-tpu/ >> .git/info/exclude`) and travels with the device tool's `carry`.
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl-tpu \
    grain==0.2.18 equinox==0.13.8 array_record==0.8.6 portpicker==1.6.0 pyte==0.8.2
ls -la .whl-tpu
