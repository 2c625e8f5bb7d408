"""`nitro.config`: the run's settings as one frozen, typed value, checked when built."""

import dataclasses
import re
from pathlib import Path

import jax
import numpy as np
import pytest
from experiments import Tiny, TinyMetrics

import jaxnitro as nx
from jaxnitro import RunConfig


def quiet(**kw):
    return {"logger": None, "checkpointer": None, **kw}


class NoData(Tiny):
    """Fails the test if setup gets as far as building the data."""

    def build_data(self, dist):
        raise AssertionError("setup built the data before refusing the configuration")


class FieldAccum(NoData):
    accum: int = 0


class MethodAccum(NoData):
    def accum(self):
        return 0


class Sourced(Tiny):
    """accum from a method, max_epochs from a field (Tiny's), the rest defaults."""

    def accum(self):
        return 2


# (keywords, error class, the message, matched whole)
REFUSALS = [
    ({"accum": 0}, nx.ConfigError, "accum must be >= 1, got 0 (from the keyword)."),
    (
        {"accum": "2"},
        nx.ConfigError,
        "accum must be an int, got '2' (from the keyword). Pass a whole number, "
        "e.g. accum=4.",
    ),
    (
        {"accum": True},
        nx.ConfigError,
        "accum must be an int, got True (from the keyword). Pass a whole number, "
        "e.g. accum=4.",
    ),
    (
        {"max_epochs": -1},
        nx.ConfigError,
        "max_epochs must be >= 0, got -1 (from the keyword).",
    ),
    (
        {"log_every_n_steps": 0},
        nx.ConfigError,
        "log_every_n_steps must be >= 1, got 0 (from the keyword).",
    ),
    (
        {"seed": "abc"},
        nx.ConfigError,
        "seed must be an int, got 'abc' (from the keyword). Pass a whole number, "
        "e.g. seed=4.",
    ),
    (
        {"seed": 1.5},
        nx.ConfigError,
        "seed must be an int, got 1.5 (from the keyword). Pass a whole number, "
        "e.g. seed=4.",
    ),
    (
        {"seed": "7"},
        nx.ConfigError,
        "seed must be an int, got '7' (from the keyword). Pass a whole number, "
        "e.g. seed=4.",
    ),
    (
        {"seed": float("inf")},
        nx.ConfigError,
        "seed must be an int, got inf (from the keyword). Pass a whole number, "
        "e.g. seed=4.",
    ),
    (
        {"seed": 2**64 + 7},
        nx.ConfigError,
        "seed=18446744073709551623 (from the keyword) is out of range: "
        "jax.random.key takes a seed from -2**63 to 2**63 - 1. Pass a smaller whole "
        "number, e.g. seed % 2**32 = 7.",
    ),
    (
        {"run_dir": None},
        nx.ConfigError,
        "run_dir must be a path (a str or an os.PathLike), got None (from the "
        'keyword). Pass a directory, e.g. run_dir="runs/mnist"; to write nothing, '
        "pass checkpointer=None and logger=None and leave run_dir at its default.",
    ),
    (
        {"run_dir": 3},
        nx.ConfigError,
        "run_dir must be a path (a str or an os.PathLike), got 3 (from the "
        'keyword). Pass a directory, e.g. run_dir="runs/mnist"; to write nothing, '
        "pass checkpointer=None and logger=None and leave run_dir at its default.",
    ),
    (
        {"run_dir": ""},
        nx.ConfigError,
        "run_dir is an empty string (from the keyword), which would scatter "
        "checkpoints and logs in the working directory unnoticed. Pass a directory, "
        'e.g. run_dir="runs/mnist", or run_dir="." to mean the working directory.',
    ),
    (
        {"gradient_clip_norm": "1.0"},
        nx.ConfigError,
        "gradient_clip_norm must be a number, got '1.0' (from the keyword). Pass a "
        "float, e.g. gradient_clip_norm=1.0; 0 turns clipping off.",
    ),
    (
        {"gradient_clip_norm": "high"},
        nx.ConfigError,
        "gradient_clip_norm must be a number, got 'high' (from the keyword). Pass a "
        "float, e.g. gradient_clip_norm=1.0; 0 turns clipping off.",
    ),
    (
        {"n_devs": 8},
        nx.ConfigError,
        "Nitro(...) (n_devs from the keyword): n_devs=8, but only {visible} {backend} "
        "device(s) are visible to this process. Pass n_devs <= {visible}, or make "
        "more devices visible before the process starts (CUDA_VISIBLE_DEVICES on a "
        "GPU host; on a CPU host XLA_FLAGS=--xla_force_host_platform_device_count=8).",
    ),
    (
        {"n_devs": 0},
        nx.ConfigError,
        "Nitro(...) (n_devs from the keyword): n_devs must be a whole number >= 1, got "
        "0. Pass e.g. n_devs=2 (n_devs=1 runs on one device, without a mesh).",
    ),
    (
        {"sharding": "zero3"},
        nx.ConfigError,
        "sharding='zero3' (from the keyword): it is \"replicated\" (every device "
        'holds the whole model; the default) or "fsdp" (parameters, optimizer state '
        "and EMA split along the data axis).",
    ),
    (
        {"monitor": ("acc", "up")},
        nx.ConfigError,
        'monitor must be a (metric, mode) pair with mode "min" or "max", such as '
        "(\"acc\", \"max\"); got ('acc', 'up').",
    ),
    (
        {"checkpointer": "yes"},
        nx.ConfigError,
        "checkpointer must be a Checkpointer or None, got str.",
    ),
    (
        {"compile_options": ["xla_cpu_enable_fast_math"]},
        nx.ConfigError,
        "compile_options must be a dict of XLA compiler options, got list.",
    ),
    (
        {"compile_options": {"xla_cpu_enable_fast_math": [True]}},
        nx.ConfigError,
        "compile_options: 'xla_cpu_enable_fast_math'=[True]; keys are XLA option "
        "names and values are bool, int, float or str.",
    ),
    (
        {"ema": 0.99},
        nx.HookError,
        "ema must be None or an EMA(beta, ...); got 0.99.",
    ),
    (  # None would have switched the divergence check off unnoticed
        {"check_divergence": None},
        nx.ConfigError,
        "check_divergence must be True or False, got None (from the keyword). Pass "
        "check_divergence=True or check_divergence=False.",
    ),
    (
        {"eval_loss": "yes"},
        nx.ConfigError,
        "eval_loss must be True or False, got 'yes' (from the keyword). Pass "
        "eval_loss=True or eval_loss=False.",
    ),
    (
        {"load_ema": 2},
        nx.ConfigError,
        "load_ema must be True or False, got 2 (from the keyword). Pass "
        "load_ema=True or load_ema=False.",
    ),
    (
        {"eval_weights": "best"},
        nx.ConfigError,
        'eval_weights=\'best\': it is "ema" or "raw".',
    ),
    (
        {"eval_weights": "ema"},
        nx.ConfigError,
        'eval_weights="ema" needs an EMA of the weights: set ema() on the experiment '
        "or pass ema=EMA(beta).",
    ),
]


@pytest.mark.parametrize(("keywords", "error", "message"), REFUSALS)
def test_a_bad_value_is_refused_when_the_config_is_built(keywords, error, message):
    if "n_devs" in keywords:  # fewer than 8 devices: 4 fake CPU ones, a TPU chip's 1
        visible, backend = len(jax.local_devices()), jax.default_backend()
        message = message.format(visible=visible, backend=backend)
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        RunConfig.resolve(NoData(), {**quiet(), **keywords})
    # The handle builds its config first: refused before the data is built.
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        nx.Nitro(NoData(), **quiet(**keywords))


def test_a_run_dir_that_is_an_existing_file_is_refused(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("not a directory")
    message = (
        f"run_dir={str(path)!r} (from the keyword) is an existing file, not a "
        "directory; the run writes its checkpoints and log inside run_dir. Pass a "
        "directory path, or move the file away."
    )
    with pytest.raises(nx.ConfigError, match=f"^{re.escape(message)}$"):
        nx.Nitro(NoData(), **quiet(run_dir=path))
    assert path.read_text() == "not a directory"


def test_a_whole_seed_of_another_type_is_kept_in_range():
    for seed, expected in [(np.int64(5), 5), (3.0, 3), (-(2**63), -(2**63))]:
        config = RunConfig.resolve(NoData(), quiet(seed=seed))
        assert type(config.seed) is int and config.seed == expected


def test_xla_refuses_an_unknown_compile_option_when_the_config_is_built():
    with pytest.raises(nx.ConfigError, match="^compile_options were refused by XLA"):
        RunConfig.resolve(NoData(), quiet(compile_options={"xla_no_such_option": 1}))


@pytest.mark.parametrize(
    ("cls", "source"), [(FieldAccum, "field"), (MethodAccum, "method")]
)
def test_a_refusal_names_where_the_value_came_from(cls, source):
    with pytest.raises(
        nx.ConfigError,
        match=re.escape(f"accum must be >= 1, got 0 (from the {source})."),
    ):
        nx.Nitro(cls(), **quiet())


def test_a_refused_setting_constructs_no_logger():
    made = []

    class Logged(NoData):
        def logger(self):
            made.append("logger")
            return None

    with pytest.raises(nx.ConfigError, match="accum must be >= 1"):
        nx.Nitro(Logged(), accum=0, checkpointer=None)
    assert made == []
    RunConfig.resolve(Logged(), {"checkpointer": None})
    assert made == ["logger"]  # the accessor runs once, after the settings pass


def test_the_config_is_frozen():
    config = nx.Nitro(Tiny(), **quiet()).config
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.accum = 4
    with pytest.raises(TypeError):
        config.sources["accum"] = "keyword"
    with pytest.raises(TypeError):
        config.compile_options["xla_cpu_enable_fast_math"] = True
    with pytest.raises(AttributeError):
        nx.Nitro(Tiny(), **quiet()).config = config


def test_a_misspelled_setting_raises_instead_of_reading_none():
    config = nx.Nitro(Tiny(), **quiet()).config
    with pytest.raises(AttributeError, match="acum"):
        _ = config.acum
    with pytest.raises(
        AttributeError, match="RunConfig has no setting 'acum'; its settings are: seed"
    ):
        config.with_value("acum", 2, source="keyword")


def test_a_changed_value_is_a_new_config_checked_like_the_first():
    config = nx.Nitro(Tiny(), **quiet()).config
    changed = config.with_value("seed", 5, source="record")
    assert (changed.seed, changed.sources["seed"]) == (5, "record")
    assert (config.seed, config.sources["seed"]) == (42, "default")
    with pytest.raises(
        nx.ConfigError, match=re.escape("accum must be >= 1, got 0 (from the record).")
    ):
        config.with_value("accum", 0, source="record")


def test_sources_must_cover_every_setting():
    config = nx.Nitro(Tiny(), **quiet()).config
    with pytest.raises(ValueError, match="without a source: \\['seed', 'run_dir'"):
        dataclasses.replace(config, sources={})
    with pytest.raises(ValueError, match="unknown sources: {'seed': 'guess'}"):
        dataclasses.replace(config, sources={**config.sources, "seed": "guess"})


def test_a_keyword_beats_a_method_or_field_which_beats_the_default():
    config = nx.Nitro(Sourced(), seed=7, **quiet()).config
    assert (config.seed, config.sources["seed"]) == (7, "keyword")
    assert (config.accum, config.sources["accum"]) == (2, "method")
    assert (config.max_epochs, config.sources["max_epochs"]) == (2, "field")
    assert (config.n_devs, config.sources["n_devs"]) == (1, "default")
    assert config.sources["logger"] == "keyword"
    over = nx.Nitro(Sourced(), accum=4, max_epochs=3, **quiet()).config
    assert (over.accum, over.sources["accum"]) == (4, "keyword")
    assert (over.max_epochs, over.sources["max_epochs"]) == (3, "keyword")


def test_plain_keywords_read_keyword_or_default():
    config = nx.Nitro(Tiny(), restore_optimizer=False, **quiet()).config
    assert (config.restore_optimizer, config.sources["restore_optimizer"]) == (
        False,
        "keyword",
    )
    assert (config.weights, config.sources["weights"]) == (None, "default")
    assert (config.resume, config.sources["resume"]) == (False, "default")
    # None asks for the default, as leaving the keyword out does.
    nones = nx.Nitro(Tiny(), steps_per_call=None, precision=None, **quiet()).config
    assert (nones.steps_per_call, nones.sources["steps_per_call"]) == (
        "auto",
        "default",
    )
    assert (nones.precision, nones.sources["precision"]) == ("f32", "default")
    assert (
        nx.Nitro(Tiny(), check_divergence=np.False_, **quiet()).config.check_divergence
        is False
    )
    assert dict(config.compile_options) == {}
    assert (config.eval_weights, config.sources["eval_weights"]) == ("raw", "default")
    with_ema = nx.Nitro(Tiny(), ema=nx.EMA(0.9), **quiet()).config
    assert (with_ema.eval_weights, with_ema.sources["eval_weights"]) == (
        "ema",
        "default",
    )


def test_the_monitor_default_and_a_method_monitor_read_as_such():
    plain = nx.Nitro(Tiny(), **quiet()).config
    assert (plain.monitor, plain.sources["monitor"]) == (("loss", "min"), "default")
    custom = nx.Nitro(TinyMetrics(), **quiet()).config
    assert (custom.monitor, custom.sources["monitor"]) == (("acc", "max"), "method")


def test_values_are_typed_and_one_of_the_type_is_kept_as_given(tmp_path):
    config = nx.Nitro(
        Tiny(),
        accum=np.int64(2),
        gradient_clip_norm=1,
        check_divergence=0,
        run_dir=Path(tmp_path / "r"),
        **quiet(),
    ).config
    assert type(config.accum) is int and config.accum == 2
    assert type(config.gradient_clip_norm) is int  # an int is a float; shown as 1
    assert config.check_divergence is False
    assert config.run_dir == str(tmp_path / "r")


def test_a_resume_reads_the_seed_from_the_record(tmp_path):
    nx.Nitro(Tiny(max_epochs=1), run_dir=str(tmp_path), logger=None, seed=5).train()
    with pytest.warns(nx.NitroWarning, match="recorded seed 5"):
        resumed = nx.Nitro(
            Tiny(max_epochs=2), run_dir=str(tmp_path), logger=None, resume="auto"
        )
    assert (resumed.config.seed, resumed.config.sources["seed"]) == (5, "record")
    assert re.search(r"^  seed +5 +from record$", resumed.binding_report(), re.M)


def test_the_binding_report_lists_the_config_and_its_sources():
    nitro = nx.Nitro(Sourced(), seed=7, **quiet())
    report = nitro.binding_report()
    reported = list(nitro.config.reported())
    rows = report.splitlines()[1 : 1 + len(reported)]
    assert [row.split()[0] for row in rows] == reported
    for line, source in (
        (r"seed +7 +from keyword", "keyword"),
        (r"accum +2 +from method", "method"),
        (r"max_epochs +2 +from field", "field"),
        (r"monitor +\('loss', 'min'\) +from default", "default"),
        (r"checkpointer +None +from keyword", "keyword"),
    ):
        assert re.search(rf"^  {line}$", report, re.M), (source, report)


def test_every_run_keyword_is_documented_once_in_runconfig():
    """RunConfig's docstring is the one reference of the Nitro keywords (the Nitro
    docstring points to it): each keyword has an entry there, and none a second one
    in Nitro's."""
    from jaxnitro.run.accessors import RUN_KEYWORDS

    def entries(doc):
        return set(re.findall(r"^\s+(?:- `)?(\w+)`?(?: \([^)]*\))?:", doc, re.M))

    documented = entries(RunConfig.__doc__)
    assert set(RUN_KEYWORDS) | {"checkpoint"} <= documented
    # Nitro documents its positional `preset` argument and its `data` attribute.
    assert not (set(RUN_KEYWORDS) - {"data", "preset"}) & entries(nx.Nitro.__doc__)
