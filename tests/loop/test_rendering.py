"""render: one figure per sample through visualize and save_figure."""

import os

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from experiments import Tiny, make_batches  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

import jaxnitro as nx  # noqa: E402
from jaxnitro.compile.cache import program_cache  # noqa: E402


class Drawn(Tiny):
    def build_data(self, dist):
        batches = make_batches(24, 4, extra=True)  # 4 samples a batch, with names
        return {"train": batches[:4], "val": batches[4:]}

    def visualize(self, outputs, *, x, name):
        figure = Figure(figsize=(2, 2))
        axes = figure.add_subplot()
        axes.plot(x)
        title = name if outputs is None else f"{name}: {int(np.argmax(outputs))}"
        axes.set_title(title)
        assert x.shape == (8,) and isinstance(name, str)  # the batch dimension dropped
        assert outputs is None or outputs.shape == (3,)
        return figure


def test_data_mode_writes_one_figure_per_sample_and_compiles_nothing(tmp_path):
    nitro = nx.Nitro(Drawn(), run_dir=str(tmp_path), logger=None, checkpointer=None)
    before = len(program_cache().program_keys())
    paths = nitro.render(split="val", batches=2)
    assert len(program_cache().program_keys()) == before
    names = [os.path.basename(p) for p in paths]
    assert names == [f"val_{i:03d}.png" for i in range(8)]
    assert all(os.path.getsize(p) > 1000 for p in paths)
    assert os.path.dirname(paths[0]) == str(tmp_path / "viz")


def test_prediction_mode_and_a_batch_in_hand(tmp_path):
    nitro = nx.Nitro(Drawn(), run_dir=str(tmp_path), logger=None, checkpointer=None)
    batch = make_batches(3, 3, extra=True)[0]
    paths = nitro.render(batch, predictions=True, out_dir=str(tmp_path / "out"))
    assert [os.path.basename(p) for p in paths] == ["000.png", "001.png", "002.png"]
    tagged = nitro.render(batch, tag="x", out_dir=str(tmp_path / "out"))
    assert os.path.basename(tagged[-1]) == "x_002.png"


def test_a_custom_save_figure_and_the_missing_hooks(tmp_path):
    class Text(Drawn):
        def visualize(self, outputs, *, name):
            return f"sample {name}"

        def save_figure(self, figure, stem):
            path = stem + ".txt"
            with open(path, "w") as f:
                f.write(figure)
            return path

    nitro = nx.Nitro(Text(), run_dir=str(tmp_path), logger=None, checkpointer=None)
    paths = nitro.render(split="val")
    texts = []
    for path in paths:
        with open(path) as f:
            texts.append(f.read())
    assert texts == [f"sample s{i}" for i in range(16, 20)]

    class NoSaver(Drawn):
        def visualize(self, outputs, *, name):
            return name

    plain = nx.Nitro(NoSaver(), run_dir=str(tmp_path), logger=None, checkpointer=None)
    with pytest.raises(nx.HookError, match="NoSaver has no save_figure"):
        plain.render(split="val")
    bare = nx.Nitro(Tiny(), run_dir=str(tmp_path), logger=None, checkpointer=None)
    with pytest.raises(nx.HookError, match="Tiny has no visualize hook.*data mode"):
        bare.render(split="val")


def test_an_unknown_split_or_batch_count_is_a_config_error_as_in_evaluate():
    nitro = nx.Nitro(Drawn(), logger=None, checkpointer=None)
    with pytest.raises(nx.ConfigError, match=r"render\(split='nope'\): the data has"):
        nitro.render(split="nope")
    with pytest.raises(nx.ConfigError, match=r"render\(batches=0\) must be an int"):
        nitro.render(split="val", batches=0)
