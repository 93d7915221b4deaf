"""Wall time of a full data hyper-cleaning run (MNIST, softmax regression, OEHG by default).

Runs `fewshot hpo cleaning` with the default settings (8000/2000/10000, 50% corrupted labels,
U = 5, T = 1000) in this process, times it, and writes OUT/bench_RESULT.json (RESULT: the run's
JSON, which lands in OUT too, so experiments.hpo_cleaning.table can use it) with the wall time
next to the run's own result.
The issue's target: a full MNIST-SR OEHG run in under 15 minutes on the project's 2-core CPU.

    OMP_NUM_THREADS=1 python -m benchmarks.bench_hpo_cleaning --data-root DIR [--method oehg] \
        [--model sr] [--out runs/hpo_cleaning]
    python -m benchmarks.bench_hpo_cleaning --smoke --data-root DIR --out DIR  # the suite's run
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

from experiments.hpo_cleaning.table import smoke_flags
from fewshot.cli.main import main as fewshot_main
from fewshot.hpo.tasks.cleaning import result_stem
from fewshot.runtime.io import atomic_write_json


def main() -> None:
    """Time one full cleaning run and record the result beside the wall time."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--dataset", default="mnist")
    parser.add_argument("--model", default="sr")
    parser.add_argument("--method", default="oehg")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/hpo_cleaning")
    parser.add_argument(
        "--smoke", action="store_true", help="a few hundred images, 2 outer steps (the suite's)"
    )
    args, extra = parser.parse_known_args()
    if args.smoke:  # the sizes of the cleaning table's smoke run, before the caller's flags
        extra = [*smoke_flags((args.dataset, args.model, args.method, args.seed)), *extra]
    argv = ["hpo", "cleaning", "--dataset", args.dataset, "--model", args.model]
    argv += ["--method", args.method, "--seed", str(args.seed), "--out", args.out]
    argv += ["--device", "cpu", *extra]
    if args.data_root:
        argv += ["--data-root", args.data_root]
    start = time.perf_counter()
    status = fewshot_main(argv)
    seconds = time.perf_counter() - start
    if status:
        raise SystemExit(status)
    name = f"{result_stem(args.dataset, args.model, args.method, args.seed)}.json"
    result = json.loads((Path(args.out) / name).read_text())
    bench = {
        "command": "fewshot " + " ".join(argv),
        "wall_seconds": seconds,
        "hpo_seconds": result["seconds_hpo"],
        "test_accuracy": result["test_accuracy"],
        "f1": result["f1"],
        "torch_threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "cpu_count": os.cpu_count(),
        "load_average_1min_at_end": os.getloadavg()[0],
        "machine": platform.processor() or platform.machine(),
    }
    atomic_write_json(bench, Path(args.out) / f"bench_{name}")
    print(f"wall time: {seconds:.0f} s ({seconds / 60:.1f} min); target < 15 min")


if __name__ == "__main__":
    main()
