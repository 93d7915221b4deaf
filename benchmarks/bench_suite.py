"""`fewshot bench` on a suite's cells against one `fewshot eval` command per cell, side by side.

The zoo's Omniglot Conv-4 ProtoNet (models/omniglot/protonet_conv4_trainval.pt) on the cells of
the omniglot-v1 suite (the Omniglot test split; 5w1s, 5w5s, 20w1s, 20w5s; 15 queries, 2000
episodes, seed 0), float32 (`--amp off`), each arm a fresh process as a user runs it:

- A: the four `fewshot eval --way W --shot S --episodes 2000 --seed 0` commands, one per cell
  (each embeds the split once with its evaluation cache): their summed wall time;
- B: one `fewshot bench omniglot-v1 MODEL --no-stored` into a fresh --out folder (nothing to
  skip), which embeds the split once for all four cells (its in-memory feature store). Its time
  includes drawing and writing the four manifests of episodes and the leaderboard; the
  manifests' share is timed apart, once, in this process.

A and B alternate (their order swapped every round) for --repeats rounds, after one small
untimed command that warms the page cache. Printed: each round's seconds, the medians, the
ratio B / A against the goal (at most 0.5: the split embedded once per split, not once per
cell), and the largest difference between the accuracies of the two arms (the same episodes:
0 expected).

With --maml, the zoo's CPU MAML (models/omniglot/maml_conv4_5way1shot_cpu.pt) on the cells
5w1s and 5w5s, the first --limit episodes of each (default 200): `fewshot bench --cells 5w1s
5w5s --limit L` against the two `fewshot eval --episodes L` commands, and the seconds per
episode of each (startup included). The MAML family adapts its network to every episode, so
there is nothing to cache: its row is bounded by the adaptation and the ratio stays near 1.

Threads: each command runs with this process's environment (set OMP_NUM_THREADS; one thread is
the setting on a shared 2-core CPU). --smoke: the cells 5w1s and 20w1s, 20 episodes each, one
round, no warm-up.

    OMP_NUM_THREADS=1 python -m benchmarks.bench_suite --repeats 2
    OMP_NUM_THREADS=1 python -m benchmarks.bench_suite --repeats 1 --maml
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.bench_throughput import device_name
from fewshot.benchmark.suites import Cell, load_suite
from fewshot.cli.bench import cell_manifest

GOAL = 0.5  # the bench's row against the summed `fewshot eval` commands
SUITE = "omniglot-v1"
REPO = Path(__file__).resolve().parents[1]
PROTONET = REPO / "models" / "omniglot" / "protonet_conv4_trainval.pt"
MAML = REPO / "models" / "omniglot" / "maml_conv4_5way1shot_cpu.pt"
MAML_CELLS = ("5w1s", "5w5s")  # the 5-way cells: the MAML checkpoint's classifier has 5 ways
SMOKE_EPISODES = 20
SMOKE_CELLS = ("5w1s", "20w1s")  # --smoke: two cells, a 5-way and a 20-way


def command(argv: list[str], cwd: Path) -> float:
    """Run `python -m fewshot ARGV` in a fresh process; its wall seconds (its output shown on
    failure)."""
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "fewshot", *argv], cwd=cwd, capture_output=True, text=True
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.stdout.write(done.stdout + done.stderr)
        raise SystemExit(f"fewshot {' '.join(argv)} failed with exit status {done.returncode}")
    return seconds


def eval_argv(model: Path, cell: Cell, episodes: int, out: Path, data_root: str | None) -> list:
    """`fewshot eval` of `model` on the episodes of `cell` (its first `episodes`)."""
    argv = ["eval", "--checkpoint", str(model), "--way", str(cell.way), "--shot", str(cell.shot)]
    argv += ["--query", str(cell.query), "--episodes", str(episodes), "--seed", str(cell.seed)]
    argv += ["--amp", "off", "--out", str(out)]
    return argv + (["--data-root", data_root] if data_root else [])


def bench_argv(
    model: Path, cells: list[Cell], limit: int | None, out: Path, data_root: str | None
) -> list:
    """`fewshot bench` of `model` on `cells` of the suite (the first `limit` episodes each)."""
    argv = ["bench", SUITE, str(model), "--amp", "off", "--no-stored", "--out", str(out)]
    if limit is not None:
        argv += ["--limit", str(limit)]
    if len(cells) < len(load_suite(SUITE).cells):
        argv += ["--cells", *[cell.name for cell in cells]]
    return argv + (["--data-root", data_root] if data_root else [])


def eval_accuracy(path: Path) -> float:
    """The accuracy of a `fewshot eval` result."""
    return json.loads(path.read_text())["accuracy"]


def bench_accuracy(out: Path, limit: int | None, cell: Cell) -> float:
    """The accuracy of the bench's one model on `cell`, from its result file."""
    folder = out / "results" if limit is None else out / f"first-{limit}" / "results"
    [path] = folder.glob(f"*/{cell.name}.json")
    return json.loads(path.read_text())["summary"]["accuracy"]


class Arms:
    """The two arms on one model and its cells, each run into fresh folders under `root`."""

    def __init__(self, model, cells, episodes, limit, root, data_root) -> None:
        self.model, self.cells, self.episodes, self.limit = model, cells, episodes, limit
        self.root, self.data_root, self.runs = root, data_root, 0
        self.accuracies: dict[str, dict[str, list[float]]] = {"eval": {}, "bench": {}}

    def fresh(self, name: str) -> Path:
        """A new folder for one run's outputs."""
        self.runs += 1
        folder = self.root / f"{self.model.stem}-{self.runs:02d}-{name}"
        folder.mkdir()
        return folder

    def evals(self) -> float:
        """Arm A: one `fewshot eval` per cell; the summed seconds."""
        folder, seconds = self.fresh("eval"), 0.0
        for cell in self.cells:
            out = folder / f"{cell.name}.json"
            argv = eval_argv(self.model, cell, self.episodes, out, self.data_root)
            seconds += command(argv, folder)
            self.accuracies["eval"].setdefault(cell.name, []).append(eval_accuracy(out))
        return seconds

    def bench(self) -> float:
        """Arm B: one `fewshot bench` on every cell into a fresh folder; its seconds."""
        folder = self.fresh("bench")
        out = folder / "out"
        seconds = command(
            bench_argv(self.model, self.cells, self.limit, out, self.data_root), folder
        )
        for cell in self.cells:
            accuracy = bench_accuracy(out, self.limit, cell)
            self.accuracies["bench"].setdefault(cell.name, []).append(accuracy)
        return seconds

    def run(self, repeats: int) -> tuple[list[float], list[float]]:
        """Both arms, their order swapped every round; each round's seconds of A and of B."""
        a, b = [], []
        for round_ in range(repeats):
            for arm in "AB" if round_ % 2 == 0 else "BA":
                (a if arm == "A" else b).append(self.evals() if arm == "A" else self.bench())
            print(f"  round {round_ + 1}: A {a[-1]:7.1f} s   B {b[-1]:7.1f} s", flush=True)
        return a, b

    def largest_difference(self) -> float:
        """The largest difference (points) between any two accuracies of a cell, both arms and
        every round."""
        largest = 0.0
        for cell in self.cells:
            values = self.accuracies["eval"][cell.name] + self.accuracies["bench"][cell.name]
            largest = max(largest, max(values) - min(values))
        return largest

    def accuracy_line(self) -> str:
        """Each cell's accuracy (the bench's first round)."""
        return ", ".join(f"{c.name} {self.accuracies['bench'][c.name][0]:.2f}" for c in self.cells)


def manifest_seconds(cells: list[Cell], data_root: str | None, root: Path) -> float:
    """Seconds to draw, check and write the cells' manifests as `fewshot bench` does."""
    folder = root / "manifests-timed"
    start = time.perf_counter()
    for cell in cells:
        cell_manifest(cell, data_root, folder)
    return time.perf_counter() - start


def load_average() -> str:
    """The load average of the last 1, 5 and 15 minutes."""
    return " ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"


def main() -> None:
    """Time both arms for the ProtoNet (and with --maml for MAML) and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, help="rounds of both arms")
    parser.add_argument("--checkpoint", default=str(PROTONET), help="an embedding method")
    parser.add_argument("--maml", action="store_true", help="also the MAML row (5-way cells)")
    parser.add_argument("--maml-checkpoint", default=str(MAML))
    parser.add_argument("--limit", type=int, default=200, help="MAML's episodes a cell")
    parser.add_argument("--data-root", default=None, help="data root (default: as fewshot's)")
    parser.add_argument("--smoke", action="store_true", help="2 cells, 20 episodes, 1 round")
    args = parser.parse_args()
    if args.smoke:
        args.repeats, args.limit = 1, SMOKE_EPISODES
    suite = load_suite(SUITE)
    cells = [suite.cell(name) for name in SMOKE_CELLS] if args.smoke else list(suite.cells)
    threads = os.environ.get("OMP_NUM_THREADS", "unset")
    print(
        f"cpu: {device_name(torch.device('cpu'))}, {os.cpu_count()} cores, OMP_NUM_THREADS="
        f"{threads}, load average {load_average()}; torch {torch.__version__}, float32"
    )
    with tempfile.TemporaryDirectory(prefix="bench_suite_") as folder:
        root = Path(folder)
        if not args.smoke:  # untimed: so that neither arm pays for a cold page cache
            warm = eval_argv(Path(args.checkpoint), cells[0], 2, root / "warm.json", args.data_root)
            command(warm, root)
        episodes = SMOKE_EPISODES if args.smoke else cells[0].episodes
        limit = SMOKE_EPISODES if args.smoke else None
        drawn = manifest_seconds(cells, args.data_root, root)
        model = Path(args.checkpoint)
        print(
            f"{model.name} on {SUITE} ({', '.join(c.name for c in cells)}; {episodes} episodes "
            f"a cell, {cells[0].query} queries, seed {cells[0].seed}), {args.repeats} rounds"
        )
        print(
            f"A: {len(cells)} x fewshot eval, a process each (its evaluation cache embeds the "
            "split once per command where that pays: 2000 episodes)"
        )
        print(
            f"B: fewshot bench --no-stored into a fresh --out (the split embedded once; its time "
            f"includes drawing and writing the {len(cells)} manifests: {drawn:.1f} s here)"
        )
        arms = Arms(model, cells, episodes, limit, root, args.data_root)
        a, b = arms.run(args.repeats)
        ma, mb = statistics.median(a), statistics.median(b)
        ratio = mb / ma
        print(f"{f'A (sum of {len(cells)} fewshot eval)':<28} {ma:8.1f} s")
        print(f"{'B (fewshot bench)':<28} {mb:8.1f} s")
        verdict = "met" if ratio <= GOAL else "MISSED"
        print(f"ratio B / A {ratio:.3f}: goal <= {GOAL} {verdict}")
        print(f"accuracy %: {arms.accuracy_line()}")
        print(f"largest accuracy difference: {arms.largest_difference():.2g} points")
        if args.maml:
            maml_row(args, suite, root)
    print(f"load average at the end {load_average()}")


def maml_row(args: argparse.Namespace, suite, root: Path) -> None:
    """The MAML family's row: bench against the matching evals, seconds per episode."""
    maml_cells = [suite.cell(name) for name in MAML_CELLS]
    maml = Path(args.maml_checkpoint)
    arms = Arms(maml, maml_cells, args.limit, args.limit, root, args.data_root)
    count = args.limit * len(maml_cells)
    print(
        f"{maml.name} on {SUITE} {' '.join(MAML_CELLS)}, the first {args.limit} episodes "
        f"each (--limit), {args.repeats} rounds (no cache: it adapts to every episode)"
    )
    a, b = arms.run(args.repeats)
    ma, mb = statistics.median(a), statistics.median(b)
    label = f"A (sum of {len(maml_cells)} fewshot eval)"
    print(f"{label:<28} {ma:8.1f} s  {ma / count:.4f} s/episode")
    print(f"{'B (fewshot bench)':<28} {mb:8.1f} s  {mb / count:.4f} s/episode")
    print(f"ratio B / A {mb / ma:.3f} (the adaptation bounds both; process startup included)")
    print(f"accuracy %: {arms.accuracy_line()}")
    print(f"largest accuracy difference: {arms.largest_difference():.2g} points")


if __name__ == "__main__":
    main()
