# Sourced on the device machine, in the repository root (where the device tool runs a
# command):   source scripts/device/env.sh [runtime|test]
#
# Two kinds of machine have been lent, neither with internet:
#
# - tpu: one TPU v5e chip, Python 3.11. JAX, jaxlib and libtpu sit on PYTHONPATH;
#   everything else jaxnitro needs installs from the machine's own package index
#   (file:///opt/pypi/simple), and what the index lacks from the wheels carried in
#   .whl-tpu/ (`bash scripts/device/fetch_wheels.sh tpu` makes them here).
# - gpu: one NVIDIA H200, Python 3.12, JAX with its CUDA plugin, flax, optax, orbax,
#   pytest and most test needs already installed, and no package index: what the
#   image lacks travels as the wheels in .whl-gpu/ (`fetch_wheels.sh gpu`).
#
# The kind is read off the machine (nvidia-smi: gpu; the TPU index: tpu), or taken
# from NITRO_DEVICE_KIND. Pass the wheels with the device tool's carry
# ([".whl-tpu"] or [".whl-gpu"]). They install into .device-scratch/site-<kind>-<what>,
# git-ignored, so a later call on a machine still warm finds it and installs
# nothing. That folder and src/ go at the END of PYTHONPATH, so the machine's own
# JAX stays the one imported. In test mode it adds jaxnitro's own metadata (its
# version, its console scripts), not a copy of its code: src/ is what runs, so every
# call tests the checkout it was sent. Prints the versions it ends with and exports
# NITRO_DEVICE_KIND and NITRO_JAX_PLATFORMS (tpu,cpu or cuda,cpu) for tests.sh.
_nitro_kind=${NITRO_DEVICE_KIND:-}
if [ -z "$_nitro_kind" ]; then
    if command -v nvidia-smi >/dev/null 2>&1; then
        _nitro_kind=gpu
    elif [ -d /opt/pypi/simple ]; then
        _nitro_kind=tpu
    else
        echo "device env: neither nvidia-smi nor /opt/pypi/simple here: set NITRO_DEVICE_KIND=tpu or gpu" >&2
        _nitro_kind=unknown
    fi
fi
export NITRO_DEVICE_KIND=$_nitro_kind
case $_nitro_kind in
tpu) export NITRO_JAX_PLATFORMS=tpu,cpu ;;
gpu)
    export NITRO_JAX_PLATFORMS=cuda,cpu
    # JAX takes 75% of a GPU's memory at its first use by default; a benchmark's
    # child process (throughput.py's first step) then finds none left. Allocating
    # as needed lets them share the GPU; peak-memory figures read the allocator's
    # own peak either way.
    export XLA_PYTHON_CLIENT_PREALLOCATE=${XLA_PYTHON_CLIENT_PREALLOCATE:-false}
    ;;
esac
_nitro_site=$PWD/.device-scratch/site-$_nitro_kind-${1:-runtime}
_nitro_runtime="optax safetensors rich flatbuffers"
_nitro_test="flax scikit-learn tensorboardX tensorboard matplotlib pandas
starlette uvicorn httpx mcp hypothesis pytest jaxtyping wadler-lindig typing-extensions
absl-py cloudpickle etils protobuf importlib-resources zipp"
_nitro_pip() {
    PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --disable-pip-version-check \
        --no-warn-conflicts --only-binary=:all: --target "$_nitro_site" --upgrade "$@"
}
_nitro_from_index() {
    local wanted="$_nitro_runtime"
    [ "${1:-runtime}" = test ] && wanted="$wanted $_nitro_test"
    # shellcheck disable=SC2086
    if ! _nitro_pip --index-url file:///opt/pypi/simple $wanted 2>/tmp/pip-all.err; then
        echo "device env: one install of all failed; one package at a time:" >&2
        for name in $wanted; do
            _nitro_pip --index-url file:///opt/pypi/simple "$name" 2>/dev/null \
                || echo "device env: not in the machine's index: $name" >&2
        done
    fi
}
_nitro_install() {
    local start=$SECONDS
    if [ -f "$_nitro_site/.done" ]; then
        echo "device env: $_nitro_site already installed"
        _nitro_path
        return
    fi
    mkdir -p "$_nitro_site"
    [ "$_nitro_kind" = tpu ] && _nitro_from_index "${1:-runtime}"
    local wheels=.whl-$_nitro_kind
    if [ -d "$wheels" ] && ls "$wheels"/*.whl >/dev/null 2>&1; then
        _nitro_pip --no-index --no-deps --no-compile "$wheels"/*.whl \
            || echo "device env: the carried wheels in $wheels did not install" >&2
    else
        echo "device env: no wheels in $wheels (carry it; fetch_wheels.sh $_nitro_kind makes it)" >&2
    fi
    [ "${1:-runtime}" = test ] && _nitro_metadata
    touch "$_nitro_site/.done"
    echo "device env ($_nitro_kind): installed in $((SECONDS - start)) s"
    _nitro_path
}
# jaxnitro's dist-info, what an editable install gives, built with the machine's
# setuptools (from the TPU's index, or the GPU image's own).
_nitro_metadata() {
    local built source=(--index-url file:///opt/pypi/simple)
    [ "$_nitro_kind" = tpu ] || source=(--no-index --no-build-isolation)
    built=$(mktemp -d)
    if PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q \
        --disable-pip-version-check --no-deps "${source[@]}" \
        --target "$built" . 2>/tmp/pip-self.err; then
        rm -rf "$_nitro_site"/jaxnitro-*.dist-info
        cp -r "$built"/jaxnitro-*.dist-info "$_nitro_site"/
    else
        echo "device env: jaxnitro's metadata did not build (/tmp/pip-self.err)" >&2
    fi
    rm -rf "$built"
}
_nitro_path() {
    export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$_nitro_site:$PWD/src"
    python3 -c 'import jax, optax, numpy; print("device env: jax", jax.__version__, jax.__file__, "optax", optax.__version__, "numpy", numpy.__version__, "devices", jax.devices())'
}
_nitro_install "${1:-runtime}"
