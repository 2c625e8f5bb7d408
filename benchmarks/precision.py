"""precision="bf16" against "f32" on the tutorial: test accuracy and step time.

Trains the tutorial's experiment (examples/mnist_tutorial.py, scikit-learn's digits
by default) under each precision from the same seed, then reports the test accuracy
and macro recall and the mean optimizer-step time of the last epoch. The target is
bf16 accuracy within 0.5 points of f32; on a CPU bf16 is usually slower, since XLA
emulates much of bfloat16 there, so the step time is reported, not judged.

The tutorial needs flax, grain and scikit-learn (`pip install -e .[examples]`; on the
device machine `source scripts/device/env.sh test` with the carried wheels).

    python benchmarks/precision.py [--epochs N]
"""

from __future__ import annotations

import argparse
import importlib.util
import os

from _common import backend_info, banner


def tutorial_module():
    path = os.path.join(
        os.path.dirname(__file__), "..", "examples", "mnist_tutorial.py"
    )
    spec = importlib.util.spec_from_file_location("mnist_tutorial_bench", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(tutorial, precision: str, epochs: int) -> dict:
    import jaxnitro as nx

    nitro = nx.Nitro(
        tutorial.MnistMLP(max_epochs=epochs),
        precision=precision,
        logger=None,
        checkpointer=None,
        early_stop=None,
    )
    nitro.train()
    test = nitro.evaluate(split="test")
    return {
        "acc": test["acc"],
        "macro_recall": test["macro_recall"],
        "step_ms": nitro.status.step_seconds * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args()
    info = backend_info()
    print(banner(info))
    tutorial = tutorial_module()
    results = {p: run(tutorial, p, args.epochs) for p in ("f32", "bf16")}
    print(f"tutorial, {args.epochs} epochs, same seed")
    print("precision  test_acc  macro_recall  step_ms (last epoch)")
    for precision, r in results.items():
        print(
            f"{precision:9}  {r['acc']:8.4f}  {r['macro_recall']:12.4f}  "
            f"{r['step_ms']:7.3f}"
        )
    gap = (results["f32"]["acc"] - results["bf16"]["acc"]) * 100
    ratio = results["bf16"]["step_ms"] / results["f32"]["step_ms"]
    print(f"bf16 accuracy gap: {gap:+.2f} points (target: within 0.5)")
    cpu = info["platform"] == "cpu"
    where = "CPU: emulated bfloat16" if cpu else f"on {info['device_kind']}"
    print(f"bf16 step time: {ratio:.2f}x f32 ({where})")


if __name__ == "__main__":
    main()
