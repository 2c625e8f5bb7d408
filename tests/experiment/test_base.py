"""Experiments and markers: the dataclass, the traits, compile_view, hashability."""

import copy
import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from experiments import Tiny

import jaxnitro as nx
from jaxnitro.experiment.view import graphconst_record


class Marked(nx.Experiment):
    width: nx.GraphConst[int] = 128
    """Hidden width. Structural."""

    layers: nx.GraphConst[tuple] = (64, 32)

    smoothing: nx.Device[float] = 0.05
    """Label smoothing.

    Swept without recompiling."""

    images: nx.Host[np.ndarray] = nx.field(default_factory=lambda: np.zeros((3, 4)))
    max_epochs: int = 20
    name: str = nx.field(default="run", doc="A display name.")


def test_subclass_is_frozen_keyword_only_dataclass():
    e = Marked(width=64)
    assert dataclasses.is_dataclass(e)
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.width = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        Marked(64)  # type: ignore[misc]


def test_traits_record_the_markers():
    assert Marked.device_fields() == ("smoothing",)
    assert Marked.host_fields() == ("images", "max_epochs", "name")
    assert nx.device_fields(Marked) == ("smoothing",)
    assert nx.host_fields(Marked) == ("images", "max_epochs", "name")


def test_config_metadata_has_type_default_kind_doc_and_line():
    meta = nx.config_metadata(Marked)
    assert list(meta) == [
        "width",
        "layers",
        "smoothing",
        "images",
        "max_epochs",
        "name",
    ]
    assert meta["width"] == nx.experiment.FieldMeta(
        type=int,
        default=128,
        kind="graphconst",
        doc="Hidden width. Structural.",
        line=meta["width"].line,
    )
    assert meta["smoothing"].kind == "device" and meta["smoothing"].type is float
    assert meta["smoothing"].doc == "Label smoothing.\n\nSwept without recompiling."
    assert meta["max_epochs"].kind == "host" and meta["max_epochs"].doc is None
    assert meta["name"].doc == "A display name."
    with open(__file__) as f:
        source = f.read().splitlines()
    assert source[meta["width"].line - 1].strip().startswith("width:")


def test_required_field_reports_no_default():
    class Required(nx.Experiment):
        seed: int
        width: nx.GraphConst[int]

    assert nx.config_metadata(Required)["width"].default is nx.experiment.NO_DEFAULT
    assert Required(seed=3, width=2).seed == 3
    with pytest.raises(TypeError):
        Required(width=2)  # type: ignore[call-arg]


def test_graphconst_lists_become_tuples_and_ints_convert():
    class Lists(nx.Experiment):
        widths: nx.GraphConst[tuple] = [8, [4, 2]]  # type: ignore[assignment]
        depth: nx.GraphConst[int] = 2

    e = Lists(widths=[1, [2, 3]], depth=3.0)  # type: ignore[arg-type]
    assert e.widths == (1, (2, 3)) and Lists().widths == (8, (4, 2))
    assert e.depth == 3 and type(e.depth) is int
    with pytest.raises(nx.ConfigError, match="`depth` is declared int but got 2.5"):
        Lists(depth=2.5)  # type: ignore[arg-type]


class Declared(nx.Experiment):
    flag: nx.GraphConst[bool] = False
    rate: nx.GraphConst[float] = 0.1
    depth: nx.GraphConst[int] = 2
    variant: nx.GraphConst[str] = "a"


@pytest.mark.parametrize(
    "name, value, expected",
    [
        ("rate", 1, 1.0),
        ("rate", np.float32(0.5), 0.5),
        ("depth", np.int64(3), 3),
        ("flag", np.bool_(True), True),
        ("flag", 0, False),
        ("variant", np.str_("b"), "b"),
    ],
)
def test_graphconst_converts_to_its_declared_type(name, value, expected):
    held = getattr(Declared(**{name: value}), name)
    assert held == expected and type(held) is type(expected)


@pytest.mark.parametrize(
    "name, value, declared",
    [
        ("flag", "False", "bool"),
        ("flag", 2, "bool"),
        ("rate", None, "float"),
        ("rate", "0.5", "float"),
        ("depth", "3", "int"),
        ("depth", float("inf"), "int"),
        ("rate", 2**60 + 1, "float"),
        ("variant", 5, "str"),
    ],
)
def test_graphconst_refuses_a_value_that_does_not_convert(name, value, declared):
    with pytest.raises(nx.ConfigError) as info:
        Declared(**{name: value})
    assert f"GraphConst field `{name}` is declared {declared} but got {value!r}" in str(
        info.value
    )
    assert "Fix: pass" in str(info.value)


def test_repr_never_prints_large_arrays_or_device_buffers():
    e = Marked(images=np.zeros((1000, 784), np.float32))
    text = repr(e)
    assert "float32[1000x784]" in text and "0., 0." not in text
    on_device = dataclasses.replace(e)
    object.__setattr__(on_device, "smoothing", jnp.ones((500,)))
    assert "float32[500] on device" in repr(on_device)


def test_experiment_is_a_pytree_with_device_children():
    e = Marked()
    leaves, treedef = jax.tree_util.tree_flatten(e)
    assert leaves == [0.05]
    rebuilt = jax.tree_util.tree_unflatten(treedef, [0.5])
    assert rebuilt.smoothing == 0.5 and rebuilt.width == 128
    paths = [
        jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(e)[0]
    ]
    assert paths == [".smoothing"]


def test_compile_view_strips_host_fields_only():
    e = Marked(images=np.ones((4, 4)))
    view = nx.compile_view(e)
    assert view.images == nx.StrippedHost("images")
    assert view.max_epochs == nx.StrippedHost("max_epochs")
    assert view.width == 128 and view.smoothing == 0.05
    assert hash(view.images) == hash(nx.StrippedHost("images"))
    assert e.images.shape == (4, 4)  # the real experiment is untouched


@pytest.mark.parametrize(
    "use, operation",
    [
        (lambda s: s + 1, "the operator `+`"),
        (lambda s: 2 * s, "the operator `*`"),
        (lambda s: s[0], "indexing"),
        (lambda s: list(s), "iteration"),
        (lambda s: s.shape, "attribute `.shape`"),
        (lambda s: float(s), "float()"),
        (lambda s: np.asarray(s), "conversion to an array"),
        (lambda s: jnp.asarray(s), "conversion to a JAX array"),
        (lambda s: jnp.sum(s), "conversion to a JAX array"),
        (lambda s: jnp.where(s, 1.0, 0.0), "conversion to a JAX array"),
        (lambda s: jnp.exp(s), "conversion to a JAX array"),
        (lambda s: jax.lax.exp(s), "an operand of a jax.lax operation"),
        (lambda s: jax.lax.add(1.0, s), "an operand of a jax.lax operation"),
        (lambda s: bool(s), "conversion to bool"),
        (lambda s: len(s), "len()"),
    ],
)
def test_stripped_host_raises_naming_field_and_fixes(use, operation):
    sentinel = nx.compile_view(Marked()).images
    with pytest.raises(nx.StrippedHostError) as info:
        use(sentinel)
    message = str(info.value)
    assert "Host field `images` of Marked" in message
    assert operation in message
    assert "GraphConst" in message and "Device" in message and "host-side" in message


def test_stripped_host_inside_jit_raises():
    view = nx.compile_view(Marked())

    @jax.jit
    def traced(x):
        return x * view.max_epochs

    with pytest.raises(nx.StrippedHostError, match="`max_epochs`"):
        traced(jnp.ones(3))

    @jax.jit
    def primitive(x):
        return jax.lax.mul(x, view.max_epochs)

    with pytest.raises(nx.StrippedHostError, match="`max_epochs`"):
        primitive(jnp.ones(3))


def test_stripped_host_in_a_jnp_function_in_a_hook_names_the_field():
    class SumsHost(Tiny):
        weights: np.ndarray = dataclasses.field(
            default_factory=lambda: np.ones(3, np.float32)
        )

        def loss(self, logits, *, y):
            return Tiny.loss(self, logits, y=y) * jnp.sum(self.weights)

    nitro = nx.Nitro(SumsHost(), logger=None, checkpointer=None)
    with pytest.raises(nx.StrippedHostError, match="Host field `weights` of SumsHost"):
        nitro.validate()


def test_stripped_host_stays_silent_when_stored_copied_or_compared():
    sentinel = nx.compile_view(Marked()).images
    assert sentinel is not None and copy.copy(sentinel) is sentinel
    assert copy.deepcopy(sentinel) is sentinel and sentinel == nx.StrippedHost("images")


def test_graphconst_hashable_by_content_passes():
    nx.experiment.assert_graphconst_hashable(Marked(layers=(1, 2)))


def test_graphconst_hashed_by_identity_is_refused():
    class Config:
        def __init__(self):
            self.width = 3

    class Nested(nx.Experiment):
        cfg: nx.GraphConst[object] = None

    with pytest.raises(nx.ConfigError, match="`cfg` of Nested holds a Config") as info:
        nx.experiment.assert_graphconst_hashable(Nested(cfg=Config()))
    assert "flatten it into separate fields" in str(info.value)
    assert "identity" in str(info.value)


def test_graphconst_unhashable_is_refused():
    @dataclasses.dataclass
    class Mutable:
        widths: list

    class Nested(nx.Experiment):
        cfg: nx.GraphConst[object] = None

    with pytest.raises(nx.ConfigError, match="does not hash"):
        nx.experiment.assert_graphconst_hashable(Nested(cfg=Mutable([1])))
    with pytest.raises(nx.ConfigError, match="does not hash"):
        nx.experiment.assert_graphconst_hashable(Nested(cfg=np.ones(3)))


def test_a_graphconst_nan_equals_itself_as_in_the_cache_key():
    class Threshold(nx.Experiment):
        cut: nx.GraphConst[float] = 0.5
        pair: nx.GraphConst[tuple] = (1.0, 2.0)

    nan = Threshold(cut=float("nan"), pair=(1.0, float("nan")))
    nx.experiment.assert_graphconst_hashable(nan)
    # a resume compares the record's values, read back from JSON, with today's
    again = Threshold(cut=float("nan"), pair=(1.0, float("nan")))
    stored = json.loads(json.dumps(graphconst_record(nan), allow_nan=False))
    assert stored == graphconst_record(again) == {"cut": "nan", "pair": [1.0, "nan"]}


def test_graphconst_that_differs_from_its_copy_is_refused_with_that_reason():
    class Never:
        def __eq__(self, other):
            return False

        def __hash__(self):
            return 0

    class Nested(nx.Experiment):
        cfg: nx.GraphConst[object] = None

    with pytest.raises(
        nx.ConfigError, match="It does not compare equal to a copy of itself"
    ):
        nx.experiment.assert_graphconst_hashable(Nested(cfg=Never()))


def test_the_class_docstring_gains_a_marker_table():
    lines = Marked.__doc__.splitlines()
    assert lines[0] == "Fields of Marked:"  # no docstring: the table alone
    assert lines[2].split() == ["field", "kind", "type", "default", "doc"]
    rows = {line.split()[0]: line.split(None, 4) for line in lines[4:]}
    assert rows["width"] == [
        "width",
        "GraphConst",
        "int",
        "128",
        "Hidden width. Structural.",
    ]
    assert rows["smoothing"][4] == "Label smoothing. Swept without recompiling."
    assert rows["images"][:4] == ["images", "Host", "ndarray", "<factory>"]
    assert rows["max_epochs"] == ["max_epochs", "Host", "int", "20"]

    class Documented(Marked):
        """A documented experiment.

        Its second paragraph.
        """

        extra: nx.Device[float] = 0.1
        """An extra weight."""

    doc = Documented.__doc__
    assert doc.startswith(
        "A documented experiment.\n\nIts second paragraph.\n\nFields of Documented:"
    )
    assert doc.splitlines()[-1].split(None, 4) == [
        "extra",
        "Device",
        "float",
        "0.1",
        "An extra weight.",
    ]


@pytest.mark.parametrize("name", ["seed", "max_epochs"])
def test_seed_or_max_epochs_marked_graphconst_is_refused_at_setup(name):
    namespace = {"__annotations__": {name: nx.GraphConst[int]}, name: 1}
    bad = type("Bad", (Tiny,), namespace)
    with pytest.raises(
        nx.ConfigError, match=f"Field `{name}` of Bad is marked GraphConst"
    ) as info:
        nx.Nitro(bad())
    assert "mark it Host" in str(info.value)


def test_handwritten_experiment_with_traits_trains():
    from experiments import init_mlp, make_batches, mlp

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Handwritten:
        width: int = 8
        smoothing: float = 0.0
        max_epochs: int = 1

        device_fields = ("smoothing",)
        host_fields = ("max_epochs",)

        def build_data(self, dist):
            return {"train": make_batches(32, 16), "val": make_batches(16, 16, seed=1)}

        def build_model(self, rng):
            return None, init_mlp(rng, self.width), {}

        def forward(self, model, params, state, *, x):
            return mlp(params, x), state

        def loss(self, logits, *, y):
            return -jnp.mean(
                jnp.sum((1 - self.smoothing) * y * jax.nn.log_softmax(logits), -1)
            )

    assert nx.config_metadata(Handwritten)["width"].kind == "graphconst"
    nitro = nx.Nitro(Handwritten(), logger=None, checkpointer=None)
    assert isinstance(nitro.experiment.smoothing, jax.Array)
    nitro.train()
    assert nitro.current_step == 2
    assert np.isfinite(nitro.history[-1]["loss"])
    assert nx.compile_view(Handwritten()).max_epochs == nx.StrippedHost("max_epochs")


def test_an_unknown_field_keyword_is_refused_naming_the_fields():
    with pytest.raises(nx.ConfigError) as info:
        Marked(widht=3)
    message = str(info.value)
    assert "Marked has no field `widht` (got widht=3). Did you mean `width`?" in message
    assert "Its fields: " in message


class Variants(Tiny):
    head: nx.GraphConst[str] = "linear"
    mode: str = "fast"

    def forward(self, model, params, state, *, x):
        heads = {"linear": lambda h: h, "double": lambda h: 2.0 * h}
        pick = nx.dispatch_variant(self, "head", choices=tuple(heads))
        return heads[pick](super().forward(model, params, state, x=x)[0]), state


def test_dispatch_variant_folds_a_graphconst_branch_at_trace_time():
    quiet = {"logger": None, "checkpointer": None}
    batch = {"x": np.ones((4, 8), np.float32)}
    linear = nx.Nitro(Variants(), **quiet).predict(batch)
    doubled = nx.Nitro(Variants(head="double"), **quiet).predict(batch)
    np.testing.assert_allclose(doubled, 2.0 * linear, rtol=1e-6)
    assert nx.dispatch_variant(Variants(), "mode") == "fast"  # a Host field, on host


@pytest.mark.parametrize(
    "field, choices, message",
    [
        ("haed", None, "Variants has no field 'haed'. Did you mean `head`?"),
        ("smoothing", None, "Variants.smoothing is a Device field, a traced input"),
        ("head", ("mlp", "cnn"), "Variants.head='linear' is not one of the variants"),
    ],
)
def test_dispatch_variant_refusals(field, choices, message):
    with pytest.raises(nx.ConfigError) as info:
        nx.dispatch_variant(Variants(), field, choices=choices)
    assert message in str(info.value)
