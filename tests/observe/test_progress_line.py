"""The progress line: what it says and how far it has filled, through a run."""

from __future__ import annotations

from jaxnitro.observe.progress_line import ProgressLine


def test_the_line_reads_as_a_person_expects_and_fills_by_the_run():
    line = ProgressLine()
    line.begin("setup", 0, 0, 0)
    line.set_phase("building data")
    line.note = "decoding 1200/5000"
    assert line.description() == "setup [building data] (decoding 1200/5000)"
    assert line.fraction is None and line.closing("") == "setup done"
    line.begin("train", 4, 3, 40)  # a resumed run starts at epoch 3
    assert line.description() == "epoch 3/40: train" and line.fraction == 2 / 40
    for _ in range(4):
        line.step()
    assert line.fraction == 3 / 40
    line.begin("val", 2, 3, 40)  # validation holds the run's fraction
    line.step()
    assert line.fraction == 3 / 40
    assert line.closing("") == "done: 3/40 epochs"
    line.begin("test", 4, 0, 0)  # a stretch without epochs fills by its units
    line.step()
    assert line.fraction == 0.25 and line.closing("") == "test done"
