"""Device fields, set_device and device_value; presets; derive."""

import re

import jax
import numpy as np
import pytest
from experiments import Tiny, make_batches

import jaxnitro as nx


class WithArrays(Tiny):
    class_weights: nx.Device[np.ndarray] = nx.field(
        default_factory=lambda: np.ones(3, np.float64)
    )
    steps: nx.Device[int] = 3
    flag: nx.Device[bool] = False
    label: str = "plain"

    @classmethod
    def presets(cls):
        return {
            "reference": {"width": 8, "smoothing": 0.0},
            "current": {"width": 32, "smoothing": 0.1, "label": "cur"},
        }


def quiet(**kw):
    return {"logger": None, "checkpointer": None, **kw}


def test_device_fields_become_arrays_with_declared_dtypes():
    nitro = nx.Nitro(WithArrays(), **quiet())
    e = nitro.experiment
    assert isinstance(e.smoothing, jax.Array) and e.smoothing.dtype == np.float32
    assert e.steps.dtype == np.int32 and e.flag.dtype == np.bool_
    assert e.class_weights.dtype == np.float32 and e.class_weights.shape == (3,)
    assert nitro.device_value("smoothing") == 0.0
    np.testing.assert_array_equal(nitro.device_value("class_weights"), np.ones(3))
    assert isinstance(nitro.device_value("steps"), int)


def test_set_device_writes_and_compiles_nothing():
    nitro = nx.Nitro(WithArrays(), **quiet())
    batch = {"x": np.ones((5, 8), np.float32)}
    first = nitro.predict(batch)
    before = nx.cache_stats()
    nitro.set_device(temperature=2.0)
    second = nitro.predict(batch)
    assert nx.cache_stats()["misses"] == before["misses"]
    np.testing.assert_allclose(second, first / 2.0, rtol=1e-5)
    assert nitro.device_value("temperature") == 2.0
    nitro.set_device(class_weights=[1.0, 2.0, 3.0], steps=4.0)
    assert nitro.device_value("steps") == 4
    # The positional form writes one field, and may join keywords.
    assert nitro.set_device("temperature", 1.0, steps=5) is nitro
    np.testing.assert_allclose(nitro.predict(batch), first, rtol=1e-5)
    assert nitro.device_value("steps") == 5


@pytest.mark.parametrize(
    "args, kw, message",
    [
        (("temperature",), {}, "one field positionally as (name, value)"),
        (
            (2.0, "temperature"),
            {},
            "got 2 positional argument(s): (2.0, 'temperature')",
        ),
        (("temperature", 2.0), {"temperature": 3.0}, "given both positionally and"),
        (("width", 4), {}, "`width` is GraphConst"),
    ],
)
def test_set_device_positional_refusals(args, kw, message):
    nitro = nx.Nitro(WithArrays(), **quiet())
    with pytest.raises(nx.ConfigError) as info:
        nitro.set_device(*args, **kw)
    assert message in str(info.value)
    assert nitro.device_value("temperature") == 1.0  # nothing written


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"width": 4}, "`width` is GraphConst: it bakes into the compiled graph"),
        (
            {"max_epochs": 4},
            "`max_epochs` is a Host field: no compiled program reads it",
        ),
        ({"nope": 1}, "WithArrays has no field `nope`"),
        (
            {"smoothing": "high"},
            "Device field `smoothing` holds float32 values; 'high'",
        ),
        ({"steps": 2.5}, "is not integral and would be truncated"),
        ({"flag": 1}, "holds bool values"),
        (
            {"steps": 2**40},
            "`steps` holds int32 values, from -2147483648 to 2147483647; got "
            "1099511627776, out of that range",
        ),
        (
            {"class_weights": np.ones(4)},
            "`class_weights` has shape (3,); the new value has shape (4,)",
        ),
    ],
)
def test_set_device_refusals(kw, message):
    nitro = nx.Nitro(WithArrays(), **quiet())
    with pytest.raises(nx.ConfigError) as info:
        nitro.set_device(**kw)
    assert message in str(info.value)
    if "nope" not in kw:  # spec: in every one of those cases the answer is a new Nitro
        assert "new Nitro" in str(info.value)


def test_an_integer_out_of_the_device_dtype_range_is_refused_at_setup():
    with pytest.raises(nx.ConfigError, match="got 8589934597, out of that range"):
        nx.Nitro(WithArrays(steps=2**33 + 5), **quiet())

    class Ids(Tiny):
        ids: nx.Device[np.ndarray] = nx.field(
            default_factory=lambda: np.array([2**31, 7])
        )

    with pytest.raises(
        nx.ConfigError,
        match="`ids` holds int32 values.*got values from 7 to 2147483648",
    ):
        nx.Nitro(Ids(), **quiet())


def test_set_device_refuses_a_scheduled_field():
    schedules = {"smoothing": lambda total: lambda t: 0.1}
    nitro = nx.Nitro(WithArrays(), schedules=schedules, **quiet())
    with pytest.raises(
        nx.ConfigError, match="`smoothing` is scheduled(.|\n)*Build a new Nitro"
    ):
        nitro.set_device(smoothing=0.3)


def test_device_value_refuses_other_fields():
    nitro = nx.Nitro(WithArrays(), **quiet())
    with pytest.raises(nx.ConfigError, match="`width` is a GraphConst field of"):
        nitro.device_value("width")
    with pytest.raises(nx.ConfigError, match="`label` is a Host field of"):
        nitro.device_value("label")
    with pytest.raises(nx.ConfigError, match="`nope` is no field of"):
        nitro.device_value("nope")


def test_presets_and_from_preset():
    assert set(nx.presets(WithArrays)) == {"reference", "current"}
    e = nx.from_preset(WithArrays, "current", max_epochs=7)
    assert (e.width, e.smoothing, e.label, e.max_epochs) == (32, 0.1, "cur", 7)
    with pytest.raises(
        nx.ConfigError,
        match='no preset "missing". Its presets are: "reference", "current"',
    ):
        nx.from_preset(WithArrays, "missing")
    with pytest.raises(nx.ConfigError, match="`widht` is not a field of WithArrays"):
        nx.from_preset(WithArrays, "current", widht=3)


def test_preset_with_an_unknown_key_is_refused():
    class BadPreset(Tiny):
        @classmethod
        def presets(cls):
            return {"p": {"widht": 3}}

    with pytest.raises(nx.ConfigError, match='Preset "p" sets `widht`'):
        nx.from_preset(BadPreset, "p")


def test_nitro_preset_form_splits_keywords(tmp_path):
    nitro = nx.Nitro(
        WithArrays, "current", max_epochs=1, width=16, run_dir=str(tmp_path / "r")
    )
    assert nitro.experiment.width == 16 and nitro.experiment.label == "cur"
    assert nitro.frozen()["preset"] == "current"
    assert nitro.params_to_log()["preset"] == "current"
    nitro.train()
    info = nx.checkpoint_info(
        tmp_path / "r" / nx.read_manifest(tmp_path / "r")[-1].file
    )
    assert info["preset"] == "current"
    lines = (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()
    assert '"preset": "current"' in lines[0]


def test_nitro_preset_form_refusals():
    with pytest.raises(nx.ConfigError, match="data= is refused in the preset form"):
        nx.Nitro(WithArrays, "current", data={})
    with pytest.raises(
        nx.ConfigError, match="bogus: neither a run keyword nor a field"
    ) as info:
        nx.Nitro(WithArrays, "current", bogus=1)
    assert "Run keywords: seed" in str(info.value) and "Fields: " in str(info.value)
    with pytest.raises(nx.ConfigError, match='no preset "nope"'):
        nx.Nitro(WithArrays, "nope")
    with pytest.raises(nx.ConfigError, match="preset='made-up': WithArrays declares"):
        nx.Nitro(WithArrays(), preset="made-up", **quiet())


def test_the_preset_form_takes_the_deprecated_checkpoint_keyword(tmp_path):
    trained = nx.Nitro(
        WithArrays, "current", max_epochs=1, run_dir=str(tmp_path), logger=None
    )
    trained.train()
    record = tmp_path / nx.read_manifest(tmp_path)[-1].file
    with pytest.warns(DeprecationWarning, match="deprecated spelling of weights="):
        loaded = nx.Nitro(WithArrays, "current", checkpoint=str(record), **quiet())
    with pytest.raises(nx.ConfigError, match="checkpoint= and weights= were both"):
        nx.Nitro(WithArrays(), checkpoint=str(record), weights=str(record), **quiet())
    for a, b in zip(
        jax.tree.leaves(loaded.parameters),
        jax.tree.leaves(trained.parameters),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)


def test_unknown_run_keyword_is_refused():
    with pytest.raises(
        nx.ConfigError, match="Unknown Nitro keyword max_epoch. The run keywords are"
    ):
        nx.Nitro(Tiny(), max_epoch=3)


def test_an_unknown_run_keyword_suggests_the_near_one():
    with pytest.raises(nx.ConfigError, match="\\. Did you mean `max_epochs`\\?$"):
        nx.Nitro(Tiny(), max_epoch=3)
    with pytest.raises(
        nx.ConfigError,
        match="Unknown Nitro keywords checkpointr, zzz\\..* checkpointr: Did you mean "
        "`checkpointer`\\?$",
    ):
        nx.Nitro(Tiny(), checkpointr=None, zzz=1)
    with pytest.raises(nx.ConfigError, match="Did you mean `max_epochs`\\?$"):
        nx.Nitro(Tiny, "current", max_epoch=3)


def test_an_experiment_field_or_method_passed_to_nitro_says_where_it_goes():
    method = (
        "learning_rate=0.01 was passed to Nitro, but `learning_rate` is a method of "
        "Tiny, not a run keyword: the experiment answers it. Set it on the experiment "
        "in either form: a method, `def learning_rate(self, group=None): return "
        "0.01`, or a field, `learning_rate: float = 0.01` in the class, then "
        "Nitro(Tiny(learning_rate=0.01))."
    )
    with pytest.raises(nx.ConfigError, match=f"^{re.escape(method)}$"):
        nx.Nitro(Tiny(), learning_rate=0.01, **quiet())
    field = (
        "width=32 was passed to Nitro, but `width` is a field of Tiny, not a run "
        "keyword. Set it on the experiment, Nitro(Tiny(width=32)), or in the preset "
        'form, Nitro(Tiny, "preset name", width=32).'
    )
    with pytest.raises(nx.ConfigError, match=f"^{re.escape(field)}$"):
        nx.Nitro(Tiny(), width=32, **quiet())
    hook = (
        "forward=None was passed to Nitro, but `forward` is a method of Tiny, not a "
        "run keyword: the experiment answers it. Override the method in the class, "
        "`def forward(self, ...)`."
    )
    with pytest.raises(nx.ConfigError, match=f"^{re.escape(hook)}$"):
        nx.Nitro(Tiny(), forward=None, **quiet())
    with pytest.raises(nx.ConfigError, match="`learning_rate` is a method of"):
        nx.Nitro(WithArrays, "current", learning_rate=0.01)


class Derived(Tiny):
    class_weights: nx.Device[np.ndarray] = nx.field(
        default_factory=lambda: np.zeros(0, np.float32)
    )
    n_seen: int = 0

    def derive(self, data):
        labels = np.concatenate([b["y"].argmax(-1) for b in data["train"]])
        counts = np.bincount(labels, minlength=3)
        return {"class_weights": counts / counts.sum(), "n_seen": int(labels.size)}


def test_derive_merges_host_values_before_device_conversion():
    nitro = nx.Nitro(Derived(), **quiet())
    assert nitro.experiment.n_seen == 64
    weights = nitro.device_value("class_weights")
    assert weights.shape == (3,) and weights.dtype == np.float32
    assert weights.sum() == pytest.approx(1.0)


def test_derive_with_an_unknown_key_is_refused():
    class BadDerive(Tiny):
        def derive(self, data):
            return {"class_wieghts": 1.0}

    with pytest.raises(nx.ConfigError, match="derive returned `class_wieghts`"):
        nx.Nitro(BadDerive(), **quiet())


def derives(values):
    class Shaped(Tiny):
        dims: nx.GraphConst[tuple] = (4,)
        depth: nx.GraphConst[int] = 2

        def derive(self, data):
            return values

    return Shaped


@pytest.mark.parametrize(
    "name, value, expected",
    [("dims", [8, [4, 2]], (8, (4, 2))), ("depth", np.float64(3.0), 3)],
)
def test_derived_graphconst_values_convert_like_the_constructor(name, value, expected):
    held = getattr(nx.Nitro(derives({name: value})(), **quiet()).experiment, name)
    assert held == expected and type(held) is type(expected)


def test_a_derived_graphconst_value_that_does_not_convert_is_refused():
    with pytest.raises(
        nx.ConfigError,
        match="derive's value for `depth` is refused: GraphConst field `depth` is "
        "declared int but got '3'",
    ):
        nx.Nitro(derives({"depth": "3"})(), **quiet())


def test_data_keyword_skips_build_data():
    class NoBuildData(nx.Experiment):
        def build_model(self, rng):
            return Tiny().build_model(rng)

        def forward(self, model, params, state, *, x):
            return Tiny().forward(model, params, state, x=x)

        def loss(self, logits, *, y):
            return Tiny().loss(logits, y=y)

    nitro = nx.Nitro(NoBuildData(), data={"val": make_batches(16, 8)}, **quiet())
    assert set(nitro.validate()) == {"loss"}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (2**40, "out of that range"),
        (2.5, "is not integral and would be truncated"),
    ],
)
def test_a_scheduled_integer_device_value_that_does_not_fit_is_refused(value, message):
    schedules = {"steps": lambda total: lambda t: value}
    nitro = nx.Nitro(WithArrays(max_epochs=1), schedules=schedules, **quiet())
    with pytest.raises(nx.ConfigError) as info:
        nitro.train()
    assert "The schedule for `steps` gave it" in str(info.value)
    assert message in str(info.value)


def test_a_scheduled_integer_device_value_reaches_the_field():
    schedules = {"steps": lambda total: lambda t: 7}
    nitro = nx.Nitro(WithArrays(max_epochs=1), schedules=schedules, **quiet())
    nitro.train()
    assert nitro.device_value("steps") == 7


class NamedRecords(Tiny):
    max_epochs: int = 2

    def checkpoint_filename(self, *, epoch, score=None, **names):
        return f"e{epoch:04d}_{score or 0.0:.4f}"


def test_the_experiments_checkpoint_filename_names_records_and_is_looked_up_per_write(
    tmp_path, monkeypatch
):
    from checkpoint_fixtures import record_files

    class Renamed(NamedRecords):
        pass

    nitro = nx.Nitro(Renamed(), run_dir=str(tmp_path), logger=None)

    def redefine_in_epoch_2(phase, step, epoch, info):
        if epoch == 2:  # a method redefined on a live run's class names its next record
            monkeypatch.setattr(
                Renamed,
                "checkpoint_filename",
                lambda self, *, epoch, **kw: f"new{epoch}",
            )

    nx.register_phase_monitor(redefine_in_epoch_2, nitro=nitro)
    nitro.train()
    names = record_files(tmp_path)
    assert len(names) == 2 and names[1] == "new2.safetensors"
    assert re.fullmatch(r"e0001_\d\.\d{4}\.safetensors", names[0])


@pytest.mark.parametrize("checkpointer", ["default", None])
def test_a_checkpoint_filename_field_is_refused_pointing_at_the_hook(
    tmp_path, checkpointer
):
    # A field would shadow the spec's hook and name nothing: refused, even where no
    # checkpoint is written, and before anything reaches the run dir.
    class Fixed(Tiny):
        checkpoint_filename: str = "best.safetensors"

    kw = {} if checkpointer == "default" else {"checkpointer": None}
    with pytest.raises(
        nx.ConfigError,
        match=r"Fixed has a field `checkpoint_filename` \(= 'best.safetensors'\), "
        r"but checkpoint_filename is a hook, not a value: .* Rename the field and "
        r"define the method, e.g. `def checkpoint_filename\(self, \*, epoch, step, "
        r".*Checkpointer\(name=\.\.\.\)",
    ):
        nx.Nitro(Fixed(), run_dir=str(tmp_path / "run"), logger=None, **kw)
    assert not (tmp_path / "run").exists()


def test_a_broken_checkpoint_filename_hook_fails_at_setup(tmp_path):
    class Broken(Tiny):
        def checkpoint_filename(self, *, epoch):
            return f"e{epoch}"

    with pytest.raises(nx.ConfigError, match="checkpoint_filename failed on sample"):
        nx.Nitro(Broken(), run_dir=str(tmp_path), logger=None)
