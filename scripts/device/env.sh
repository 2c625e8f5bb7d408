# Sourced on the TPU machine, in the repository root (where the device tool runs a
# command):   source scripts/tpu/env.sh [runtime|test]
#
# That machine has no internet. JAX, jaxlib and libtpu sit on PYTHONPATH; everything
# else jaxnitro needs installs from the machine's own package index
# (file:///opt/pypi/simple) into .tpu-scratch/site-<what>, and what the index lacks
# from the wheels carried in .whl-tpu/ (scripts/tpu/fetch_wheels.sh makes them here;
# pass carry=[".whl-tpu"]). The folder is git-ignored, so a later call on a machine
# still warm finds it and installs nothing. It and src/ go at the END of PYTHONPATH,
# so that the machine's own JAX stays the one imported. Prints the versions it ends
# with. In test mode it adds jaxnitro's own metadata (below), not a copy of its code.
_nitro_site=$PWD/.tpu-scratch/site-${1:-runtime}
_nitro_runtime="optax safetensors rich flatbuffers"
_nitro_test="flax scikit-learn tensorboardX tensorboard matplotlib pandas
starlette uvicorn httpx mcp hypothesis pytest jaxtyping wadler-lindig typing-extensions
absl-py cloudpickle etils protobuf importlib-resources zipp"
_nitro_pip() {
    PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --disable-pip-version-check \
        --no-warn-conflicts --only-binary=:all: --target "$_nitro_site" --upgrade "$@"
}
_nitro_install() {
    local wanted="$_nitro_runtime"
    [ "${1:-runtime}" = test ] && wanted="$wanted $_nitro_test"
    local start=$SECONDS
    if [ -f "$_nitro_site/.done" ]; then
        echo "tpu env: $_nitro_site already installed"
        _nitro_path
        return
    fi
    # shellcheck disable=SC2086
    if ! _nitro_pip --index-url file:///opt/pypi/simple $wanted 2>/tmp/pip-all.err; then
        echo "tpu env: one install of all failed; one package at a time:" >&2
        for name in $wanted; do
            _nitro_pip --index-url file:///opt/pypi/simple "$name" 2>/dev/null \
                || echo "tpu env: not in the machine's index: $name" >&2
        done
    fi
    if [ -d .whl-tpu ] && ls .whl-tpu/*.whl >/dev/null 2>&1; then
        _nitro_pip --no-index --no-deps --no-compile .whl-tpu/*.whl \
            || echo "tpu env: the carried wheels did not install" >&2
    fi
    [ "${1:-runtime}" = test ] && _nitro_metadata
    touch "$_nitro_site/.done"
    echo "tpu env: installed in $((SECONDS - start)) s"
    _nitro_path
}
# jaxnitro's own dist-info (its version, its console scripts), what an editable
# install gives: the code itself stays src/ on PYTHONPATH, so every call tests the
# checkout it was sent. Built with setuptools from the machine's index.
_nitro_metadata() {
    local built
    built=$(mktemp -d)
    if PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q \
        --disable-pip-version-check --no-deps --index-url file:///opt/pypi/simple \
        --target "$built" . 2>/tmp/pip-self.err; then
        rm -rf "$_nitro_site"/jaxnitro-*.dist-info
        cp -r "$built"/jaxnitro-*.dist-info "$_nitro_site"/
    else
        echo "tpu env: jaxnitro's metadata did not build (/tmp/pip-self.err)" >&2
    fi
    rm -rf "$built"
}
_nitro_path() {
    export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$_nitro_site:$PWD/src"
    python3 -c 'import jax, optax, numpy; print("tpu env: jax", jax.__version__, jax.__file__, "optax", optax.__version__, "numpy", numpy.__version__, "devices", jax.devices())'
}
_nitro_install "${1:-runtime}"
