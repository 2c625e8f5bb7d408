import os

import pytest
from agent_root import make_root

from jaxnitro.agent.loader import build_experiment, experiment_class, under_root
from jaxnitro.errors import ConfigError, NotYetSupportedError


@pytest.fixture
def root(tmp_path):
    return make_root(tmp_path)


def test_a_named_class_is_imported_from_its_file(root):
    cls = experiment_class(root, "tiny_agent.py:TinyAgent")
    assert cls.__name__ == "TinyAgent"
    e = build_experiment(cls, None, {"width": 4, "lr": 0.1})
    assert (e.width, e.lr) == (4, 0.1)


def test_the_module_name_is_stable_so_the_compile_cache_can_hit(root):
    first = experiment_class(root, "tiny_agent.py:TinyAgent")
    second = experiment_class(root, "tiny_agent.py:TinyAgent")
    assert first is not second  # the file is read again
    assert first.__module__ == second.__module__


def test_a_preset_applies_with_overrides_winning(root):
    cls = experiment_class(root, "tiny_agent.py:TinyAgent")
    assert build_experiment(cls, "wide", None).width == 16
    assert build_experiment(cls, "wide", {"width": 5}).width == 5
    with pytest.raises(ConfigError, match='no preset "huge"'):
        build_experiment(cls, "huge", None)


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("../outside.py:X", "outside the server's root"),
        ("/etc/hosts.py:X", "outside the server's root"),
        ("tiny_agent.py", "is not of the form"),
        ("tiny_agent.txt:TinyAgent", "is not of the form"),
        ("missing.py:TinyAgent", "does not exist under the server's root"),
        ("tiny_agent.py:Nope", "has no class 'Nope'.*Broken, Slow, TinyAgent"),
        ("tiny_agent.py:batches", "not a subclass of jaxnitro.Experiment"),
    ],
)
def test_a_bad_name_is_refused_with_the_reason(root, name, match):
    with pytest.raises(ConfigError, match=match):
        experiment_class(root, name)


def test_a_run_file_is_refused_until_run_files_can_run(root):
    with pytest.raises(NotYetSupportedError, match="once `sexpgpu run` lands"):
        experiment_class(root, "mnist.sx")


def test_a_symlink_out_of_the_root_is_refused(root, tmp_path):
    outside = tmp_path / "elsewhere.py"
    outside.write_text("raise SystemExit('must never run')\n")
    os.symlink(outside, root / "link.py")
    with pytest.raises(ConfigError, match="link.py.*outside the server's root"):
        experiment_class(root, "link.py:X")
    (root / "sub").symlink_to(tmp_path)
    with pytest.raises(ConfigError, match="outside the server's root"):
        under_root(root, "sub/elsewhere.py")


def test_a_file_that_fails_to_import_is_a_config_error(root):
    (root / "bad.py").write_text("raise ValueError('broken file')\n")
    with pytest.raises(ConfigError, match="raised ValueError: broken file"):
        experiment_class(root, "bad.py:X")


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"nope": 1}, "The override `nope` is not a field of TinyAgent"),
        (
            {"width": "wide"},
            r"override width='wide': TinyAgent.width is declared int, so it takes "
            r"a whole number, not a string. Pass e.g. width=8 \(its default\).",
        ),
        ({"width": [1, 2]}, "overrides are JSON scalars"),
        ({"width": 2.5}, r"width=2.5: .* not a fraction"),
        ({"width": True}, r"width=True: .* not a boolean"),
        ({"width": None}, r"width=None: .* not null"),
        ({"lr": "fast"}, r"TinyAgent.lr is declared float, .* not a string"),
        ({"max_epochs": "abc"}, r"TinyAgent.max_epochs is declared int"),
        (
            {"width": -4},
            r"TinyAgent.width must be >= 1, got -4: the field declares ge=1",
        ),
        ({"width": 0}, r"TinyAgent.width must be >= 1, got 0"),
    ],
)
def test_a_bad_override_is_refused_by_the_field_checks(root, overrides, match):
    cls = experiment_class(root, "tiny_agent.py:TinyAgent")
    with pytest.raises(ConfigError, match=match):
        build_experiment(cls, None, overrides)


def test_overrides_of_the_declared_types_are_accepted(root):
    cls = experiment_class(root, "tiny_agent.py:TinyAgent")
    e = build_experiment(cls, None, {"width": 3.0, "lr": 1, "max_epochs": 1})
    assert (e.width, e.lr, e.max_epochs) == (3, 1, 1)
    assert build_experiment(cls, "wide", {"lr": 0.5}).width == 16


def test_a_construction_failure_of_another_kind_is_a_config_error(root):
    (root / "odd.py").write_text(
        "import jaxnitro as nx\n"
        "class Odd(nx.Experiment):\n"
        "    size: int = 1\n"
        "    def __post_init__(self):\n"
        "        super().__post_init__()\n"
        "        if self.size > 3:\n"
        "            raise ValueError('size too big for this model')\n"
    )
    cls = experiment_class(root, "odd.py:Odd")
    with pytest.raises(
        ConfigError,
        match=r"building Odd with overrides \{'size': 9\} raised ValueError: size "
        r"too big for this model. Fix the values",
    ):
        build_experiment(cls, None, {"size": 9})
