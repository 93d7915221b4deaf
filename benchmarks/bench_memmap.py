"""Data shared across ranks: start-up time and memory per rank, reading a split vs mapping it.

Writes a synthetic tieredImageNet training split in its npz format (random 84x84x3 images,
351 classes; --fraction of the real 448,695 images), then, with 2 gloo ranks each: loads it
through the reader (today's loader: every rank holds its own copy), converts it once with
`fewshot convert`'s code, and loads the converted split (mapped: the ranks share one copy).
Each rank touches every page of its images, then reports its load time, its resident memory
(RSS, counting shared pages in full) and its proportional share (PSS, shared pages divided
among the processes mapping them). Run from the repository root:

    python -m benchmarks.bench_memmap --fraction 0.25 --root /tmp/bench_tiered
    python -m benchmarks.bench_memmap --smoke --root DIR    # seconds: the test suite's run
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from fewshot.datasets import load_split
from fewshot.datasets.memmap import memmap_folder, write_memmap
from fewshot.runtime.distributed import init_distributed

TIERED_TRAIN_IMAGES = 448_695
TIERED_TRAIN_CLASSES = 351
SMOKE_FRACTION = 0.001  # 449 images, 9 MiB


def memory_gib() -> tuple[float, float]:
    """(RSS, PSS) of this process in GiB, from /proc/self/smaps_rollup."""
    values = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("Rss", "Pss"):
            values[name] = int(rest.split()[0]) / 2**20  # kB -> GiB
    return values["Rss"], values["Pss"]


def worker(root: str, converted: bool) -> None:
    """One rank: load the split, touch every page of it, report time and memory as JSON."""
    dist = init_distributed(torch.device("cpu"))
    _, pss_before = memory_gib()  # the interpreter and torch, before the data
    start = time.perf_counter()
    split = load_split("tieredimagenet", "train", root, converted=converted)
    flat = split.images.permute(0, 2, 3, 1).reshape(-1)  # the stored [N, H, W, C] bytes
    checksum = int(flat[::4096].sum())  # one byte per page: every page is read
    seconds = time.perf_counter() - start
    torch.distributed.barrier()  # both ranks hold the split while memory is measured
    rss, pss = memory_gib()
    report = {"rank": dist.rank, "seconds": seconds, "rss": rss, "pss": pss, "sum": checksum}
    print(json.dumps({**report, "data_pss": pss - pss_before}))
    torch.distributed.barrier()


def run_ranks(root: Path, converted: bool, port: int) -> list[dict]:
    """Start 2 gloo ranks of `worker` and collect their reports."""
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    args = [sys.executable, "-m", "benchmarks.bench_memmap", "--worker", "--root", str(root)]
    if converted:
        args.append("--converted")
    procs = [
        subprocess.Popen(
            args, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, stdout=subprocess.PIPE
        )
        for r in range(2)
    ]
    reports = []
    for proc in procs:
        out, _ = proc.communicate()
        if proc.returncode:
            raise SystemExit(f"a rank failed with status {proc.returncode}")
        reports.append(json.loads(out.decode().strip().splitlines()[-1]))
    return reports


def write_synthetic(root: Path, images: int, seed: int) -> float:
    """A tieredImageNet train split in the npz format; returns its size in GiB."""
    folder = root / "tieredimagenet"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (images, 84, 84, 3), dtype=np.uint8)
    np.savez(folder / "train_images.npz", images=pixels)
    labels = np.sort(rng.integers(0, TIERED_TRAIN_CLASSES, images)).astype(np.int64)
    with open(folder / "train_labels.pkl", "wb") as f:
        pickle.dump({"labels": labels}, f)
    return (folder / "train_images.npz").stat().st_size / 2**30


def main() -> None:
    """Measure both loaders side by side and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fraction", type=float, default=0.25, help="of tieredImageNet's train")
    parser.add_argument("--root", default="runs/bench_memmap", help="data root to write into")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--port", type=int, default=29531)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--converted", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--smoke", action="store_true", help=f"--fraction {SMOKE_FRACTION}")
    args = parser.parse_args()
    if args.smoke:
        args.fraction = SMOKE_FRACTION
    if args.worker:
        worker(args.root, args.converted)
        return
    root = Path(args.root)
    images = round(args.fraction * TIERED_TRAIN_IMAGES)
    size = write_synthetic(root, images, args.seed)
    print(f"synthetic tieredImageNet train: {images} images, {size:.2f} GiB npz")
    read = run_ranks(root, converted=False, port=args.port)
    start = time.perf_counter()
    write_memmap(
        load_split("tieredimagenet", "train", root, converted=False),
        memmap_folder(root, "tieredimagenet", "train"),
    )
    convert_seconds = time.perf_counter() - start
    mapped = run_ranks(root, converted=True, port=args.port + 1)
    assert read[0]["sum"] == mapped[0]["sum"], "the mapped split differs from the read one"
    print(f"conversion (once): {convert_seconds:.1f} s")
    print("| loader | rank | load + touch (s) | RSS (GiB) | PSS (GiB) | PSS of the data (GiB) |")
    print("|---|---|---|---|---|---|")
    for name, reports in (("reader (today)", read), ("mapped (converted)", mapped)):
        for r in reports:
            cells = f"{r['seconds']:.1f} | {r['rss']:.2f} | {r['pss']:.2f} | {r['data_pss']:.2f}"
            print(f"| {name} | {r['rank']} | {cells} |")
    scale = TIERED_TRAIN_IMAGES / images
    per_rank = read[0]["data_pss"] * scale  # every reading rank holds its own copy
    shared = sum(r["data_pss"] for r in mapped) * scale  # the ranks split one copy
    print(
        f"data at all {TIERED_TRAIN_IMAGES} images (x{scale:.2f}): reading, {per_rank:.1f} GiB "
        f"per rank ({8 * per_rank:.0f} GiB for 8 ranks); mapped, {shared:.1f} GiB for all ranks"
    )


if __name__ == "__main__":
    main()
