#!/usr/bin/env bash
# Run HERE (a machine with internet), from anywhere in the repository:
#
#   bash scripts/device/fetch_wheels.sh tpu    # into .whl-tpu/ (Python 3.11)
#   bash scripts/device/fetch_wheels.sh gpu    # into .whl-gpu/ (Python 3.12)
#
# downloads the wheels a device machine lacks, for x86-64, each pinned, without their
# needs (the list is the closure of what is missing there). Both folders are
# git-ignored and travel with the device tool's carry (scripts/device/env.sh installs
# them).
#
# - tpu: the machine's own package index (/opt/pypi/simple) lacks grain and equinox
#   with the needs they miss there, and pyte.
# - gpu: the H200 image (the device library's KINDS.md lists its packages) has no
#   index; it lacks grain, pyte, the serving and agent stack (starlette, uvicorn, mcp
#   with pydantic and jsonschema) and tensorboardX. mlflow-skinny and its two dozen
#   needs are left out: its 6 tests skip without it, as on the TPU. 9.3 MB in all.
set -euo pipefail
cd "$(dirname "$0")/../.."
kind=${1:-}
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
    --platform manylinux2014_x86_64)
case $kind in
tpu)
    python=3.11
    wheels=(grain==0.2.18 equinox==0.13.8 array_record==0.8.6 portpicker==1.6.0 pyte==0.8.2)
    ;;
gpu)
    python=3.12
    wheels=(grain==0.2.18 array-record==0.8.6 portpicker==1.6.0 pyte==0.8.2
        wcwidth==0.9.5 tensorboardx==2.6.5 starlette==1.10.0 uvicorn==0.55.0
        python-multipart==0.0.34 sse-starlette==3.7.1 mcp==2.3.0 mcp-types==2.3.0
        httpx2==2.17.0 httpcore2==2.17.0 truststore==0.10.5 pyjwt==2.15.1
        opentelemetry-api==1.45.2 pydantic==2.14.4 pydantic-core==2.50.5
        annotated-types==0.8.0 typing-inspection==0.4.5 jsonschema==4.26.0
        jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1)
    ;;
*)
    echo "usage: bash scripts/device/fetch_wheels.sh tpu|gpu" >&2
    exit 2
    ;;
esac
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$python" \
    --implementation cp "${platforms[@]}" -d ".whl-$kind" "${wheels[@]}"
ls -la ".whl-$kind"
