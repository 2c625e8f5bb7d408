"""Rows of a 30-epoch run for the history tests, its best epoch (19) in the middle."""

import numpy as np


def make_rows(n=30, *, peak=19):
    rows = []
    for e in range(1, n + 1):
        acc = 0.95 - abs(e - peak) / 100
        rows.append(
            {
                "epoch": e,
                "step": 100 * e,
                "train_loss": 2.0 / e,
                "loss": 2.2 / e + 0.01 * abs(e - peak),
                "acc": np.float32(acc),
                "macro_recall": acc - 0.01,
                "confusion": np.eye(3, dtype=int) * e,
                "seconds": 1.5,
            }
        )
    return rows
