"""Benchmark 5: can one core of RecordIO decoding keep up with the training step?

A ~500-image RecordIO file of JPEGs (quality 90, shorter side 256, longer side 256–384, content
with photo-like low- and mid-frequency structure so that files are 15–40 KB as for ImageNet at
this size) is generated in a temporary directory with ``tests/datagen.make_recordio``. Then, in
interleaved rounds:

* **decode**: one epoch of mxlarge's imagenet training source (``mxlarge.data.build_data``:
  ``mx.io.ImageRecordIter``
  with the training augmentation: random-resized crop to 224, flip, mean/std) with **one**
  preprocessing thread. Throughput per core = images ÷ CPU seconds of this process
  (``time.process_time``: all its threads), which on a shared machine is steadier than wall
  time and does not depend on how many cores the iterator's helper threads could borrow;
* **train**: ``resnet18_v1b`` at 224×224, batch 16, forward + backward + mxlarge update (local
  store), images/s of wall time with MXNet's default threading (the cores the process kept
  busy, CPU seconds ÷ wall seconds, are reported: about one on this 2-core machine).

Ratio = decode images per core-second ÷ training images/s; its inverse is the number of decode
cores one training process needs to never wait for data (here on CPU; the markdown also scales
it to MXNet's published K80 training speed).
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import BenchResult, Ratio, interleave, md_table, median, mmm

NET, SIZE, TRAIN_BATCH, CLASSES = "resnet18_v1b", 224, 16, 1000
NUM_IMAGES, DECODE_BATCH = 500, 32
#: MXNet's published single-K80 training speed of ResNet-50, batch 32
#: (apache/mxnet example/image-classification/README.md, "Speed and Memory Footprint").
K80_RESNET50_IMG_S = 109.0


def photo_like(rng: Any, height: int, width: int) -> Any:
    """An RGB uint8 image: smooth colour fields plus finer texture and a few hard edges."""
    import cv2
    import numpy as np

    img = np.zeros((height, width, 3), np.float32)
    for cells, amp in ((3, 90.0), (12, 40.0), (48, 18.0)):
        small = rng.normal(0, amp, size=(cells, max(2, cells * width // height), 3))
        img += cv2.resize(small.astype(np.float32), (width, height),
                          interpolation=cv2.INTER_CUBIC)
    for _ in range(4):  # rectangles: edges JPEG must spend bits on
        y0, x0 = rng.integers(0, height - 16), rng.integers(0, width - 16)
        img[y0:y0 + rng.integers(8, height // 2), x0:x0 + rng.integers(8, width // 2)] += \
            rng.normal(0, 50, size=3)
    img += rng.normal(0, 4, size=img.shape)  # sensor noise
    return np.clip(img + 128, 0, 255).astype(np.uint8)


def make_dataset(root: Path, count: int = NUM_IMAGES, seed: int = 0) -> tuple[Path, int]:
    """Writes ``train.rec``/``.idx`` of ``count`` JPEGs; returns the path and total JPEG bytes."""
    import numpy as np

    from mxlarge.data.tiny import make_recordio

    rng = np.random.default_rng(seed)
    images = []
    for _ in range(count):
        long_side = int(rng.integers(256, 385))
        h, w = (256, long_side) if rng.random() < 0.7 else (long_side, 256)
        images.append(photo_like(rng, h, w))
    rec, _ = make_recordio(root / "train.rec", images, rng.integers(0, CLASSES, size=count),
                           quality=90)
    return rec, rec.stat().st_size


def run(reps: int = 5, bar: Any = None) -> BenchResult:
    import mxnet as mx

    from benchmarks.models import build_net, recipe_loop, recipe_trainer, synthetic_batches
    from mxlarge.config import config_from_dict
    from mxlarge.data import build_data

    with tempfile.TemporaryDirectory(prefix="mxlarge-bench-rec-") as tmp:
        rec, rec_bytes = make_dataset(Path(tmp))
        cfg = config_from_dict({"data": {
            "dataset": "imagenet", "train_rec": str(rec), "val_rec": str(rec),
            "batch_size": DECODE_BATCH, "image_size": SIZE, "threads": 1,
            "num_classes": CLASSES}}).data
        # The public entry point, as a training run gets it (val is the same file: unused).
        source = build_data(cfg, rank=0, num_workers=1, seed=0).train
        per_epoch = source.steps_per_epoch * DECODE_BATCH
        wall: list[float] = []
        epoch = [0]

        def decode_round() -> float:
            mx.nd.waitall()
            c0, t0 = time.process_time(), time.perf_counter()
            n = 0
            for data, _ in source.epoch(epoch[0]):
                n += data.shape[0]
            mx.nd.waitall()
            cpu, dt = time.process_time() - c0, time.perf_counter() - t0
            epoch[0] += 1
            wall.append(n / dt)
            return n / cpu

        net = build_net(NET, CLASSES, SIZE, seed=0)
        loop = recipe_loop(net, recipe_trainer(net, "local"))
        batches = synthetic_batches(2, TRAIN_BATCH, SIZE, CLASSES)

        train_cores: list[float] = []

        def train_round() -> float:
            mx.nd.waitall()
            c0, t0 = time.process_time(), time.perf_counter()
            loop.train_step(*batches[loop.step % 2])
            loop.step += 1
            mx.nd.waitall()
            dt = time.perf_counter() - t0
            train_cores.append((time.process_time() - c0) / dt)
            return TRAIN_BATCH / dt

        train_round()  # warm-up: graph build and allocation
        decode_round()
        wall.clear()
        train_cores.clear()
        m = interleave({"decode_per_core": decode_round, "train": train_round}, reps,
                       progress=None if bar is None else lambda: bar.update(1))

    ratio = Ratio("decode_vs_train", "decode+augment images per core-second ÷ training "
                  "images/s (resnet18_v1b, 224 px, CPU)",
                  [d / t for d, t in zip(m["decode_per_core"], m["train"], strict=True)],
                  note=f"{NUM_IMAGES} JPEGs, ~{rec_bytes / NUM_IMAGES / 1e3:.0f} KB each; "
                       f"decode: 1 thread, batch {DECODE_BATCH}; train: batch {TRAIN_BATCH}, "
                       "MXNet's default threads")
    cores_needed = [1 / r for r in ratio.values]
    per_core = median(m["decode_per_core"])
    k80_cores = K80_RESNET50_IMG_S / per_core
    md = "\n".join([
        md_table(["measurement", "min / median / max"],
                 [["decode+augment, images per CPU-second (1 thread)",
                   mmm(m["decode_per_core"], "{:.0f}")],
                  ["decode+augment, images/s wall (1 thread)", mmm(wall, "{:.0f}")],
                  [f"training images/s ({NET}, {SIZE} px, batch {TRAIN_BATCH}, CPU)",
                   mmm(m["train"], "{:.2f}")],
                  ["training process: cores busy (CPU s ÷ wall s)", mmm(train_cores, "{:.2f}")],
                  ["decode cores needed per training process", mmm(cores_needed, "{:.3f}")]]),
        "",
        f"On this CPU a training process needs {median(cores_needed):.3f} decode cores: data "
        "loading is nowhere near the bottleneck when the model also trains on the CPU. On a GPU "
        f"the same decoder would have to feed e.g. MXNet's published {K80_RESNET50_IMG_S:.0f} "
        f"images/s of ResNet-50 on one K80 GPU: {k80_cores:.2f} cores of this machine per GPU "
        f"({16 * k80_cores:.0f} for the 16 GPUs of a p2.16xlarge, which has 64 vCPUs).",
    ])
    return BenchResult("input_pipeline", [ratio],
                       {"decode_img_per_cpu_s": m["decode_per_core"], "decode_img_per_s_wall": wall,
                        "train_img_per_s": m["train"], "train_cores_busy": train_cores,
                        "cores_needed": cores_needed,
                        "images_per_epoch": per_epoch, "rec_bytes": rec_bytes,
                        "k80_resnet50_cores_per_gpu": k80_cores}, md)
