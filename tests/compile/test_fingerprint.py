"""Code fingerprints: a reloaded or redefined hook, a helper it calls, and every value
a traced hook reads (globals, arrays, objects' fields, class attributes, closures)
move the key; argument names are part of the code.
"""

import dataclasses
import importlib
import sys
import textwrap
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from compile_counts import kinds_compiled
from experiments import Tiny, make_batches, mlp

import jaxnitro as nx
from jaxnitro.compile.fingerprint import fingerprint


def quiet(**kw):
    return {"logger": None, "checkpointer": None, **kw}


MODULE = """
import jax
import jax.numpy as jnp
import jaxnitro as nx
from experiments import Tiny, mlp


def activation(x):
    return {activation}


class Reloadable(Tiny):
    def forward(self, model, params, state, *, x):
        return activation(mlp(params, x)), state

    def loss(self, logits, *, y):
        return {loss}
"""


def write_module(path, activation="x", loss="Tiny.loss(self, logits, y=y)"):
    path.write_text(textwrap.dedent(MODULE.format(activation=activation, loss=loss)))


@pytest.fixture
def reloadable(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "reloadable_exp.py"
    write_module(path)
    module = importlib.import_module("reloadable_exp")
    yield module, path
    sys.modules.pop("reloadable_exp", None)


def fresh_run(module):
    nx.Nitro(module.Reloadable(max_epochs=1), **quiet()).train()


def test_reload_with_unchanged_code_compiles_nothing(reloadable):
    module, path = reloadable
    fresh_run(module)
    write_module(path)
    module = importlib.reload(module)
    assert kinds_compiled(lambda: fresh_run(module)) == []


def test_redefined_loss_recompiles_only_what_traces_it(reloadable):
    module, path = reloadable
    fresh_run(module)
    write_module(path, loss="Tiny.loss(self, logits, y=y) * 2.0")
    module = importlib.reload(module)
    assert kinds_compiled(lambda: fresh_run(module)) == ["eval_loss", "train_step"]


def test_redefined_helper_that_forward_calls_is_caught(reloadable):
    module, path = reloadable
    fresh_run(module)
    write_module(path, activation="jnp.tanh(x)")
    module = importlib.reload(module)
    assert kinds_compiled(lambda: fresh_run(module)) == ["eval_forward", "train_step"]


def test_a_global_constant_read_in_a_hook_is_in_the_key(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    source = """
import jaxnitro as nx
from experiments import Tiny, mlp

SCALE = {scale}

class Scaled(Tiny):
    def forward(self, model, params, state, *, x):
        return mlp(params, x) * SCALE, state
"""
    path = tmp_path / "scaled_exp.py"
    path.write_text(source.format(scale=1.0))
    module = importlib.import_module("scaled_exp")
    x = {"x": np.ones((2, 8), np.float32)}
    first = nx.Nitro(module.Scaled(), **quiet()).predict(x)
    path.write_text(source.format(scale=3.0))
    module = importlib.reload(module)
    second = nx.Nitro(module.Scaled(), **quiet()).predict(x)
    np.testing.assert_allclose(second, 3 * first, rtol=1e-5)
    sys.modules.pop("scaled_exp", None)


# --- what a traced hook reads beyond its globals' names ------------------------------


@dataclasses.dataclass
class ScaleConfig:
    scale: float


class ReadsArray(Tiny):
    def forward(self, model, params, state, *, x):
        out, state = Tiny.forward(self, model, params, state, x=x)
        return out * SCALE_ARRAY, state


class ReadsConfig(Tiny):
    def forward(self, model, params, state, *, x):
        out, state = Tiny.forward(self, model, params, state, x=x)
        return out * SCALE_CONFIG.scale, state


class ReadsModule(Tiny):
    def forward(self, model, params, state, *, x):
        out, state = Tiny.forward(self, model, params, state, x=x)
        return out * scale_module.factor, state


class ReadsClassAttribute(Tiny):
    factor = 1.0

    def forward(self, model, params, state, *, x):
        out, state = Tiny.forward(self, model, params, state, x=x)
        return out * type(self).factor, state


def _scaled_by_class(self, out):
    return out * self.factor  # a helper handed self reads the class attribute


class ReadsThroughHelper(Tiny):
    factor = 1.0

    def forward(self, model, params, state, *, x):
        out, state = Tiny.forward(self, model, params, state, x=x)
        return _scaled_by_class(self, out), state


class ReadsInClassmethodHook(Tiny):
    factor = 1.0

    @classmethod
    def forward(cls, model, params, state, *, x):
        return mlp(params, x) * cls.factor, state


class ReadsJittedHelper(Tiny):
    def forward(self, model, params, state, *, x):
        out, state = Tiny.forward(self, model, params, state, x=x)
        return _jitted_scale(out), state


class ReadsNamespace(Tiny):
    def forward(self, model, params, state, *, x):
        out, state = Tiny.forward(self, model, params, state, x=x)
        return out * SCALE_NAMESPACE.factor, state


class ReadsVmappedHelper(Tiny):
    def forward(self, model, params, state, *, x):
        out, state = Tiny.forward(self, model, params, state, x=x)
        return _vmapped_scale(out), state


class Scaler:
    def __init__(self, k):
        self.k = k

    def apply(self, out):
        return out * self.k


class ReadsBoundMethod(Tiny):
    def forward(self, model, params, state, *, x):
        out, state = Tiny.forward(self, model, params, state, x=x)
        return SCALER(out), state


def _make_closure_helper():
    def scaled(self, out):
        return out * self.factor

    return lambda self, out: scaled(self, out)


_closure_helper = _make_closure_helper()


class ReadsThroughClosure(Tiny):
    factor = 1.0

    def forward(self, model, params, state, *, x):
        out, state = Tiny.forward(self, model, params, state, x=x)
        return _closure_helper(self, out), state


SCALE_ARRAY = jnp.asarray(1.0)


SCALE_CONFIG = ScaleConfig(1.0)


SCALER = Scaler(1.0).apply


SCALE_NAMESPACE = types.SimpleNamespace(factor=1.0)


JIT_FACTOR = 1.0


scale_module = types.ModuleType("scale_module")  # made in memory, as in a notebook


scale_module.factor = 1.0


@jax.jit
def _jitted_scale(out):
    return out * JIT_FACTOR


@jax.vmap
def _vmapped_scale(row):
    return row * VMAP_FACTOR


VMAP_FACTOR = 1.0


def _set_scale(cls, value):
    """Change what each class's forward reads, the way a user would."""
    global SCALE_ARRAY, SCALE_CONFIG, JIT_FACTOR, VMAP_FACTOR, SCALER
    if cls is ReadsVmappedHelper:
        VMAP_FACTOR = value
    elif cls is ReadsBoundMethod:
        SCALER = Scaler(value).apply
    elif cls is ReadsArray:
        SCALE_ARRAY = jnp.asarray(value)
    elif cls is ReadsConfig:
        SCALE_CONFIG = ScaleConfig(value)
    elif cls is ReadsNamespace:
        SCALE_NAMESPACE.factor = value
    elif cls is ReadsJittedHelper:
        JIT_FACTOR = value
        _jitted_scale.clear_cache()  # jax.jit's own cache would serve the old trace
    elif cls is ReadsModule:
        scale_module.factor = value
    else:
        cls.factor = value


@pytest.mark.parametrize(
    "cls",
    [
        ReadsArray,
        ReadsConfig,
        ReadsModule,
        ReadsClassAttribute,
        ReadsThroughHelper,
        ReadsInClassmethodHook,
        ReadsJittedHelper,
        ReadsNamespace,
        ReadsVmappedHelper,
        ReadsBoundMethod,
        ReadsThroughClosure,
    ],
)
def test_a_value_a_hook_reads_is_in_the_key(cls):
    """A JAX array, a user object's field, a module's attribute and a class
    attribute, read in traced code, bake in: changing one must not hit the program
    traced with the old value."""
    batch = make_batches(4, 4)[0]
    try:
        before = nx.Nitro(cls(), **quiet()).predict(batch)
        _set_scale(cls, 5.0)
        after = nx.Nitro(cls(), **quiet()).predict(batch)
    finally:
        _set_scale(cls, 1.0)
    np.testing.assert_allclose(after, 5.0 * before, rtol=1e-6)


def test_a_level_two_optimizer_reading_self_is_keyed_by_what_it_reads():
    import optax

    class Momentum(Tiny):
        def momentum(self):
            return 0.5

        def optimizer(self, group, hp):
            # the state's structure is the same for any momentum: only the key
            # can tell the two programs apart
            return optax.sgd(hp["learning_rate"], momentum=self.momentum())

    def trained(cls):
        nitro = nx.Nitro(cls(max_epochs=2), **quiet())
        nitro.train()
        return jax.tree.leaves(nitro.parameters)

    plain = trained(Momentum)
    Momentum.momentum = lambda self: 0.9
    heavy = trained(Momentum)
    nx.cache_reset()
    fresh = trained(Momentum)
    for b, c in zip(heavy, fresh, strict=True):
        np.testing.assert_array_equal(b, c)  # the edited method took effect
    assert any(not np.array_equal(a, b) for a, b in zip(plain, heavy, strict=True))


def test_a_function_model_is_keyed_by_its_code_and_globals():
    class FunctionModel(Tiny):
        def build_model(self, rng):
            _, params, state = Tiny.build_model(self, rng)
            return scaled_mlp, params, state

        def forward(self, model, params, state, *, x):
            return model(params, x), state

    batch = make_batches(4, 4)[0]
    global MODEL_SCALE
    before = nx.Nitro(FunctionModel(), **quiet()).predict(batch)
    MODEL_SCALE = 5.0
    try:
        after = nx.Nitro(FunctionModel(), **quiet()).predict(batch)
    finally:
        MODEL_SCALE = 1.0
    np.testing.assert_allclose(after, 5.0 * before, rtol=1e-6)


MODEL_SCALE = 1.0


def scaled_mlp(params, x):
    return mlp(params, x) * MODEL_SCALE


def test_argument_names_are_in_the_code_fingerprint():
    def shift(value, offset):
        return value - offset

    original = shift

    def shift(offset, value):  # redefined: the same bytecode, a keyword call differs
        return offset - value

    assert original.__qualname__ == shift.__qualname__
    assert fingerprint(original) != fingerprint(shift)
