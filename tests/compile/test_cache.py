"""The compile cache: what moves a key, and what never does."""

import contextlib
import dataclasses
import importlib
import sys
import textwrap
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from experiments import QuietLogger, Tiny, make_batches, mlp

import jaxnitro as nx
from jaxnitro.compile.boundary import Weights
from jaxnitro.compile.cache import ProgramKey, program_cache, typed_key
from jaxnitro.compile.fingerprint import fingerprint
from jaxnitro.optim.plan import single_group_plan

BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"


@contextlib.contextmanager
def xla_compiles():
    """Record every XLA backend compile (our programs and eager ops alike)."""
    events: list[str] = []

    def listen(name, duration, **kwargs):
        if name == BACKEND_COMPILE:
            events.append(name)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        yield events
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)


def quiet(**kw):
    return {"logger": None, "checkpointer": None, **kw}


def kinds_compiled(run):
    """The program kinds `run()` added to the cache (each kind once)."""
    before = set(program_cache().program_keys())
    run()
    return sorted({key.kind for key in set(program_cache().program_keys()) - before})


class StepRecorder(QuietLogger):
    """A logger recording the cache misses at every logged line."""

    def __init__(self):
        self.lines = []

    def log_metrics(self, metrics, *, step, epoch, context, **kw):
        self.lines.append((context, epoch, step, nx.cache_stats()["misses"]))


def test_two_epochs_compile_nothing_after_the_first_step():
    nx.cache_reset()
    recorder = StepRecorder()
    nitro = nx.Nitro(Tiny(max_epochs=2, width=20), logger=recorder, checkpointer=None)
    with xla_compiles() as events:
        nitro.train()
    train = [line for line in recorder.lines if line[0] == "train"]
    assert [line[3] for line in train if line[1] == 1] == [1, 1, 1, 1]  # train_step
    after_validation = [line for line in recorder.lines if line[0] == "validate"][0][3]
    # + eval forward, + the eval loss at the full width (16) and at the short last
    # batch's real size (8), since the loss must never see padding.
    assert after_validation == 4
    assert {line[3] for line in recorder.lines if line[1] == 2} == {after_validation}
    # And XLA itself compiled nothing in the second epoch: rerun one more epoch.
    more = nx.Nitro(Tiny(max_epochs=1, width=20), **quiet())
    count = len(events)
    with xla_compiles() as again:
        more.train()
    assert again == [] and count > 0


def test_second_nitro_device_sweep_and_run_settings_compile_nothing(tmp_path):
    nx.Nitro(Tiny(max_epochs=1), **quiet()).train()
    misses = nx.cache_stats()["misses"]
    for smoothing in (0.0, 0.05, 0.1, 0.2):
        nx.Nitro(Tiny(max_epochs=1, smoothing=smoothing), **quiet()).train()
    nx.Nitro(
        Tiny(max_epochs=3), seed=7, run_dir=str(tmp_path / "elsewhere"), logger=None
    ).train()
    assert nx.cache_stats()["misses"] == misses


def test_graphconst_change_compiles_new_programs():
    nx.Nitro(Tiny(max_epochs=1, width=16), **quiet()).train()
    kinds = kinds_compiled(
        lambda: nx.Nitro(Tiny(max_epochs=1, width=24), **quiet()).train()
    )
    assert kinds == ["eval_forward", "eval_loss", "train_step"]
    kinds = kinds_compiled(
        lambda: nx.Nitro(Tiny(max_epochs=1, width=24), accum=2, **quiet()).train()
    )
    assert kinds == ["gradient", "optimizer"]


class Offsets(Tiny):
    offsets: nx.GraphConst[tuple] = (1, 2)

    def forward(self, model, params, state, *, x):
        logits, state = Tiny.forward(self, model, params, state, x=x)
        offsets = jnp.asarray(self.offsets)[None, :]
        rows = jnp.ones((x.shape[0], 1), offsets.dtype)
        # 1 / -0.0 is -inf: the inverse shows the sign of a baked zero.
        return {
            "logits": logits,
            "offsets": rows * offsets,
            "inverse": rows / offsets,
        }, state

    def loss(self, out, *, y):
        return Tiny.loss(self, out["logits"], y=y)


def test_graphconst_values_python_calls_equal_compile_apart():
    # (1, 2) == (True, 2.0) and 0.0 == -0.0, with equal hashes, yet each bakes
    # another constant: a shared key would serve the first program for both.
    batch = make_batches(4, 4)[0]

    def predict(value):
        return nx.Nitro(Offsets(offsets=value), **quiet()).predict(batch)

    ints, mixed = predict((1, 2))["offsets"], predict((True, 2.0))["offsets"]
    assert ints.dtype == np.int32 and mixed.dtype == np.float32
    zero, negative_zero = predict((0.0, 1.0)), predict((-0.0, 1.0))
    assert zero["inverse"][0, 0] == np.inf and negative_zero["inverse"][0, 0] == -np.inf
    misses = nx.cache_stats()["misses"]
    assert predict((1, 2))["offsets"].dtype == np.int32
    assert nx.cache_stats()["misses"] == misses  # each value hits its own program


def test_typed_key_tells_apart_values_python_calls_equal():
    @dataclasses.dataclass(frozen=True)
    class Cfg:
        width: float

    for a, b in [
        ((1, 2), (True, 2.0)),
        (0.0, -0.0),
        (frozenset({1}), frozenset({1.0})),
        ({"a": 1}, {"a": True}),
        (Cfg(1), Cfg(1.0)),
        (np.float32(1.0), 1.0),
    ]:
        assert a == b and typed_key(a) != typed_key(b)
    assert typed_key((1, (2.0, "x"))) == typed_key((1, (2.0, "x")))
    assert typed_key(float("nan")) == typed_key(float("nan"))


def test_baked_constants_key_with_their_types():
    def key(baked):
        return ProgramKey(
            kind="gradient",
            experiment=("m", "E"),
            graphconst=(),
            code="",
            model=None,
            signature=(),
            baked=baked,
            compile_options=(),
        )

    assert key((("inv_accum", 1.0),)) == key((("inv_accum", 1.0),))
    assert key((("inv_accum", 1.0),)) != key((("inv_accum", 1),))
    assert key((("clip", 0.0),)) != key((("clip", -0.0),))


def test_clip_threshold_compiles_nothing_and_switching_it_on_only_the_optimizer():
    def run(clip, accum):
        nx.Nitro(
            Tiny(max_epochs=1), gradient_clip_norm=clip, accum=accum, **quiet()
        ).train()

    run(0.0, 2)
    assert kinds_compiled(lambda: run(1.0, 2)) == ["optimizer"]
    assert kinds_compiled(lambda: run(2.5, 2)) == []  # the threshold is an input
    run(1.0, 1)
    assert kinds_compiled(lambda: run(0.5, 1)) == []


def test_accum_recompiles_only_the_gradient():
    nx.Nitro(Tiny(max_epochs=1), accum=2, **quiet()).train()
    accum = kinds_compiled(
        lambda: nx.Nitro(Tiny(max_epochs=1), accum=4, **quiet()).train()
    )
    assert accum == ["gradient"]


def test_clipping_matches_optax():
    import optax

    params = {"w": np.full((3,), 2.0, np.float32)}
    grads = {"w": np.full((3,), 4.0, np.float32)}  # global norm 6.93
    plan = single_group_plan(params, learning_rate=0.1, clip_norm=1.0)

    def step(p, state, g, hp):
        return plan.apply(None, Weights(p, state, None), g, hp)[0]

    new = jax.jit(step)(params, plan.init_state(params), grads, plan.step_inputs(0))
    clipped, _ = optax.clip_by_global_norm(1.0).update(grads, optax.EmptyState())
    updates, _ = optax.radam(0.1).update(clipped, optax.radam(0.1).init(params), params)
    np.testing.assert_allclose(new["w"], params["w"] + updates["w"], rtol=1e-6)


def test_clip_zero_emits_no_clipping_ops():
    import optax

    params = {"w": np.ones((4, 4), np.float32)}

    def lowered(plan, by_hand=False):
        def step(p, state, grads, hp):
            if by_hand:  # the rule alone, written by hand
                lr = hp["groups"]["default"]["learning_rate"]
                updates, state = optax.radam(lr).update(grads, state, p)
                new = jax.tree.map(lambda a, u: (a + u).astype(a.dtype), p, updates)
                return new, state
            return plan.apply(None, Weights(p, state, None), grads, hp)[:2]

        args = (params, plan.init_state(params), params, plan.step_inputs(0))
        text = jax.jit(step).lower(*args).as_text()
        return [line for line in text.splitlines() if "stablehlo." in line]

    off = single_group_plan(params, learning_rate=1e-3, clip_norm=0.0)
    on = single_group_plan(params, learning_rate=1e-3, clip_norm=1.0)
    assert lowered(off) == lowered(off, by_hand=True)
    clipped = lowered(on)
    by_hand = lowered(on, by_hand=True)
    assert len(clipped) > len(by_hand)
    sqrt = sum("stablehlo.sqrt" in line for line in clipped)
    assert sqrt == sum("stablehlo.sqrt" in line for line in by_hand) + 1


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


def test_cache_reset_empties_and_counts():
    nx.Nitro(Tiny(), **quiet()).validate()
    assert nx.cache_stats()["entries"] > 0
    nx.cache_reset()
    assert nx.cache_stats() == {"hits": 0, "misses": 0, "entries": 0}
    nx.Nitro(Tiny(), **quiet()).validate()
    assert nx.cache_stats()["misses"] == 3  # forward; the loss at widths 16 and 8


def test_persistent_cache_directory_follows_the_environment(tmp_path, monkeypatch):
    from jaxnitro.compile import cache

    monkeypatch.setattr(cache, "_persistent_configured", False)
    monkeypatch.setenv("JAXNITRO_COMPILATION_CACHE", str(tmp_path / "xla"))
    previous = jax.config.jax_compilation_cache_dir
    try:
        jax.config.update("jax_compilation_cache_dir", None)
        assert cache.configure_persistent_cache() == str(tmp_path / "xla")
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "xla")
    finally:
        jax.config.update("jax_compilation_cache_dir", previous)


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
