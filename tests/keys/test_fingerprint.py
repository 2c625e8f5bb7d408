"""Code fingerprints: a reloaded or redefined hook, a helper it calls, and every value
a traced hook reads (globals, arrays, objects' fields, class attributes, closures)
move the key; argument names are part of the code.
"""

import dataclasses
import importlib
import json
import re
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
from jaxnitro.keys import fingerprint as fingerprint_module
from jaxnitro.keys.fingerprint import _Fingerprinter, fingerprint


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


class ReadsVocabulary(Tiny):
    def forward(self, model, params, state, *, x):
        out, state = Tiny.forward(self, model, params, state, x=x)
        return out * len(VOCABULARY[2]), state


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


VOCABULARY = np.array(["cat", "dog", "x"], dtype=object)  # Python objects


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
    elif cls is ReadsVocabulary:
        VOCABULARY[2] = "x" * int(value)  # written in place
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
        ReadsVocabulary,
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
    nx.compile.cache_reset()
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


# --- which names are looked up in the globals -----------------------------------------

SWEEP_MODULE = """
import jax
import jax.numpy as jnp
from experiments import N_CLASSES, Tiny

smoothing = 0.0


class Smoothed(Tiny):
    def loss(self, logits, *, y):
        target = (1 - self.smoothing) * y + self.smoothing / N_CLASSES
        return -jnp.mean(jnp.sum(target * jax.nn.log_softmax(logits), -1))
"""


def test_a_sweep_whose_loop_variable_shares_a_fields_name_compiles_once(
    tmp_path, monkeypatch
):
    """`for smoothing in values: Nitro(E(smoothing=smoothing)).train()`: the
    script's global `smoothing` is not what `self.smoothing` reads."""
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "sweep_exp.py").write_text(SWEEP_MODULE)
    module = importlib.import_module("sweep_exp")
    try:
        misses = []
        for value in (0.0, 0.1, 0.2):
            module.smoothing = value
            experiment = module.Smoothed(smoothing=value, max_epochs=1)
            misses.append(
                kinds_compiled(lambda e=experiment: nx.Nitro(e, **quiet()).train())
            )
    finally:
        sys.modules.pop("sweep_exp", None)
    assert misses[0] != []
    assert misses[1:] == [[], []]


MATRIX_SOURCE = """
class Holder:
    smoothing = 0.5

    def scaled(self, x):
        return x * self.smoothing


class Owner:
    smoothing = 0.25

    def reads_field(self, x):
        return x * self.smoothing

    def reads_class_attribute(self, x):
        return x * Holder.smoothing

    def calls_method(self, x):
        return HOLDER.smoothing(x)

    def reads_global(self, x):
        return x * smoothing


class Methods:
    def smoothing(self, x):
        return x * 2.0


HOLDER = Methods()


def make_closure(smoothing):
    def reads_closure(self, x):
        return x * smoothing

    return reads_closure


reads_closure = make_closure(0.5)
smoothing = 1.0
"""


@pytest.fixture
def matrix():
    """A module made in memory (a user module) whose global `smoothing` shares
    the name of a field, a class attribute, a method and a closure variable."""
    module = types.ModuleType("fingerprint_matrix")
    exec(MATRIX_SOURCE, vars(module))
    return module


def _printed(module, name):
    owner = module.Owner
    fn = module.reads_closure if name == "reads_closure" else vars(owner)[name]
    return fingerprint(fn, owner=owner)


@pytest.mark.parametrize(
    "name", ["reads_field", "reads_class_attribute", "calls_method", "reads_closure"]
)
def test_a_global_sharing_an_attribute_or_closure_name_is_not_in_the_key(matrix, name):
    before = _printed(matrix, name)
    matrix.smoothing = 2.0
    assert _printed(matrix, name) == before  # no false miss


@pytest.mark.parametrize(
    ("name", "change"),
    [
        ("reads_global", lambda m: setattr(m, "smoothing", 2.0)),
        ("reads_field", lambda m: setattr(m.Owner, "smoothing", 0.75)),
        ("reads_class_attribute", lambda m: setattr(m.Holder, "smoothing", 0.75)),
        ("calls_method", lambda m: setattr(m, "HOLDER", m.Holder())),
        ("reads_closure", lambda m: setattr(m, "reads_closure", m.make_closure(3.0))),
    ],
)
def test_what_the_code_really_reads_is_still_in_the_key(matrix, name, change):
    before = _printed(matrix, name)
    change(matrix)
    assert _printed(matrix, name) != before  # no wrong hit


NESTED_SOURCE = """
def outer(self):
    def inner():
        return [GLOBAL_IN_COMPREHENSION for _ in self.items]

    return self.method() + len(inner()) + GLOBAL_AT_TOP
"""


def test_global_names_decodes_load_global_and_reads_nested_code():
    from jaxnitro.keys.fingerprint import global_names

    namespace: dict = {}
    exec(NESTED_SOURCE, namespace)
    assert global_names(namespace["outer"].__code__) == {
        "GLOBAL_IN_COMPREHENSION",
        "GLOBAL_AT_TOP",
        "len",
    }


HASH_SEED_SCRIPT = """
from jaxnitro.keys.fingerprint import fingerprint
KINDS = frozenset({"alpha", "beta", "gamma", "delta"})
def literal(x):
    return x in {"alpha", "beta", "gamma", "delta", "eps"}
def named(x):
    return x in KINDS
print(fingerprint(literal, contents=False), fingerprint(named))
"""


@pytest.mark.slow
def test_a_fingerprint_is_the_same_in_every_process(tmp_path):
    # A resume compares the fingerprints a record kept with a new process's: a set
    # literal or frozenset, whose order follows the per-process string hash, must
    # not read as changed code.
    import os
    import subprocess

    script = tmp_path / "prints.py"
    script.write_text(HASH_SEED_SCRIPT)
    outputs = {
        subprocess.run(
            [sys.executable, str(script)],
            env={
                **os.environ,
                "PYTHONPATH": os.pathsep.join(sys.path),  # this checkout's jaxnitro
                "PYTHONHASHSEED": str(seed),
            },
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in (1, 2, 3, 4)
    }
    assert len(outputs) == 1


USER_MODULE = """
import json

import jax
import jax.numpy as jnp

import jaxnitro as nx
from experiments import Tiny, mlp

KINDS = frozenset({"alpha", "beta", "gamma", "delta"})


def scaled(logits):
    return logits * (2.0 if "beta" in KINDS else 1.0)


class Config:
    depth = 2


class Moved(Tiny):
    def forward(self, model, params, state, *, x):
        return scaled(mlp(params, x)) * Config.depth, state

    def loss(self, logits, *, y):
        return -jnp.mean(jnp.sum(y * jax.nn.log_softmax(logits), -1)){changed}


def prints():
    from jaxnitro.experiment.hooks import hook_fingerprints

    return json.dumps(hook_fingerprints(Moved), sort_keys=True)


if __name__ == "__main__":
    print(prints())
"""
IMPORTER = "from model_def import *\nprint(prints())\n"


def test_code_in_a_user_module_has_one_fingerprint_in_every_process(tmp_path):
    # A record keeps its hooks' fingerprints and a resume in a new process compares
    # them: the same code run as the main script, or imported from its module
    # (`from model_def import *`), must not read as changed; a changed body must.
    import subprocess

    from process_jobs import child_env

    same, changed = tmp_path / "same", tmp_path / "changed"
    for folder, body in ((same, ""), (changed, " * 0.5")):
        folder.mkdir()
        (folder / "model_def.py").write_text(USER_MODULE.replace("{changed}", body))
        (folder / "importer.py").write_text(IMPORTER)
    runs = [  # (folder, script, hash seed), all at once
        (same, "model_def.py", "1"),
        (same, "importer.py", "2"),
        (same, "importer.py", "3"),
        (changed, "importer.py", "2"),
    ]
    children = [
        subprocess.Popen(
            [sys.executable, script],
            cwd=folder,
            env=child_env(PYTHONHASHSEED=seed),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for folder, script, seed in runs
    ]
    outputs = []
    for child in children:
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0, err[-3000:]
        outputs.append(json.loads(out.strip().splitlines()[-1]))
    as_main, imported, again, edited = outputs
    assert set(as_main) >= {"forward", "loss"}
    assert as_main == imported == again
    assert edited["forward"] == imported["forward"]
    assert edited["loss"] != imported["loss"]


# --- values the fingerprint describes by their elements, or cannot describe ---------


LABEL_NAMES = np.array(["cat", "dog", "bird"], dtype=object)


class ReadsLabelNames(Tiny):
    def loss(self, logits, *, y):
        return Tiny.loss(self, logits, y=y) * len(LABEL_NAMES[0]) / 3


def test_an_object_array_a_hook_reads_trains_and_its_elements_are_in_the_key():
    """A vocabulary held as an object array: its bytes are addresses, so it is
    described element by element; the same words in a new array hit the cache, a
    changed word recompiles what reads it."""
    global LABEL_NAMES

    def run():
        nx.Nitro(ReadsLabelNames(max_epochs=1), **quiet()).train()

    try:
        assert kinds_compiled(run) != []
        LABEL_NAMES = np.array(["cat", "dog", "bird"], dtype=object)
        assert kinds_compiled(run) == []
        LABEL_NAMES = np.array(["bird", "dog", "cat"], dtype=object)
        assert kinds_compiled(run) == ["eval_loss", "train_step"]
    finally:
        LABEL_NAMES = np.array(["cat", "dog", "bird"], dtype=object)


def test_an_object_array_is_described_by_its_elements():
    words = np.array(["a", "b", None], dtype=object)
    rows = np.array([(1, "a")], dtype=[("i", np.int32), ("s", object)])

    def prints(array):
        return fingerprint(lambda x: x * len(array))

    assert prints(words) == prints(np.array(["a", "b", None], dtype=object))
    assert prints(words) != prints(np.array(["a", "c", None], dtype=object))
    assert prints(words) != prints(np.array(["a", "b", None], dtype=object)[None])
    assert prints(rows) != prints(np.array([(1, "b")], dtype=rows.dtype))


def test_an_object_array_too_large_to_describe_is_named_with_a_warning(monkeypatch):
    monkeypatch.setattr(fingerprint_module, "OBJECT_ELEMENTS_DESCRIBED", 2)
    words = np.array(["a", "b", "c"], dtype=object)

    def reads_words(x):
        return x * len(words)

    assert _Fingerprinter(contents=True).value(words) == (
        "undigestable numpy.ndarray object(3,): holds 3 Python objects, more than "
        "the 2 described"
    )
    message = (
        "jaxnitro: the compile cache cannot see the contents of a numpy.ndarray "
        "object(3,), reached from `{}` (holds 3 Python objects, more than the 2 "
        "described). A compiled program is reused while the code is unchanged"
    ).format(f"{reads_words.__module__}.{reads_words.__qualname__}")
    with pytest.warns(nx.NitroWarning, match=re.escape(message)):
        fingerprint(reads_words)


class LazyTable:
    """A handle that opens on first use: any attribute read before that raises."""

    def __getattr__(self, name):
        raise RuntimeError(f"LazyTable is not open (reading {name})")


LAZY_TABLE = None  # opened in the test: pytest's collection reads the module's globals


class ReadsLazyTable(Tiny):
    def loss(self, logits, *, y):
        assert LAZY_TABLE is not None
        return Tiny.loss(self, logits, y=y)


def test_a_value_whose_attributes_raise_is_named_and_both_checks_say_so():
    """The fingerprint never raises: the stale-handle check and the compile cache
    each warn, once, that they cannot see the value."""
    reason = (
        f"a {__name__}.LazyTable, reached from `{__name__}.ReadsLazyTable.loss` "
        f"(RuntimeError: LazyTable is not open (reading __wrapped__))"
    )
    global LAZY_TABLE
    LAZY_TABLE = LazyTable()
    try:
        with pytest.warns(nx.NitroWarning) as record:
            for _ in range(2):  # and once only
                nx.Nitro(ReadsLazyTable(max_epochs=1), **quiet()).train()
    finally:
        LAZY_TABLE = None
    assert sorted(str(w.message) for w in record) == [
        f"jaxnitro: the compile cache cannot see the contents of {reason}. A "
        f"compiled program is reused while the code is unchanged, so after a change "
        f"to this value the programs that read it keep the value they were traced "
        f"with. Make it a value the fingerprint can read (numbers, strings, tuples, "
        f"dataclasses, NumPy arrays), pass it to the hook as an input, or call "
        f"`nx.compile.cache_reset()` after changing it.",
        f"jaxnitro: the stale-handle check cannot see {reason}: a change to it will "
        f"not be reported. Rebuild the `Nitro` after changing it.",
    ]
