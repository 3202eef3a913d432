"""Tests of mxlarge/config/, one file per module; GOOD and write() are the experiment file
they share."""
from pathlib import Path

GOOD = """
name: t
data: {dataset: digits, batch_size: 16}
optim: {base_lr: 0.05, reference_batch: 16, decay_epochs: [2, 3], warmup_epochs: 1}
train: {epochs: 4}
"""


def write(tmp_path: Path, text: str, name: str = "exp.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p
