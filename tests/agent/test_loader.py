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
        ({"width": "wide"}, "declared int but got 'wide'"),
        ({"width": [1, 2]}, "overrides are JSON scalars"),
    ],
)
def test_a_bad_override_is_refused_by_the_field_checks(root, overrides, match):
    cls = experiment_class(root, "tiny_agent.py:TinyAgent")
    with pytest.raises(ConfigError, match=match):
        build_experiment(cls, None, overrides)
