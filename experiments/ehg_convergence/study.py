"""EHG to convergence: Omniglot, Conv-4, ProtoNet and ridge, U = 1 vs 5, several training seeds.

Every (method, U, seed) model is trained with the episode shape of experiments/ehg_seeds
(20-way 1-shot 5-query, 2 episodes per step) on a budget long enough for validation accuracy to
plateau, Adam 1e-3 halved at mid-run; best.pt (best 5-way validation) is tested on the same
seeded 5-way and 20-way 1-shot test episodes. U5 - U1 is measured across seeds with
`fewshot compare-seeds` and per test episode for one seed with `fewshot compare`; the metrics
logs give the episodes each arm needs to reach fixed validation accuracies. The methods are
those of METHODS (the heads and, for experiments/ehg_adaptation, ANIL and MAML); the episode
shape, budget and test ways are flags.

The study runs only through the `fewshot` command line (subprocesses), never the library's
internals, so it runs against any checkout (--cli-dir) with any interpreter (--python).
Resumable: finished runs are skipped, unfinished ones continued with --resume, and test results
are cached as the JSON files of compare-seeds / compare; results are rewritten after every job.

    python -m experiments.ehg_convergence.study    # from the repository root
    python -m experiments.ehg_convergence.study --smoke --out DIR    # the test suite's run
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from experiments.ehg_convergence.layout import (
    SMOKE,
    finished,
    ints,
    method_seeds,
    pair_file,
    run_dir,
    seeds_file,
    test_flags,
    train_argv,
)
from experiments.ehg_convergence.report import report
from experiments.smoke import add_smoke_flag, apply_smoke


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The study's settings (from the command line unless `argv` is given)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable, help="interpreter running the CLI")
    parser.add_argument("--cli-dir", default=".", help="working folder of the CLI (its fewshot)")
    parser.add_argument("--methods", default="protonet,ridge", help="comma-separated methods")
    parser.add_argument("--resplits", default="1,5", help="U values, the baseline first")
    parser.add_argument("--seeds", default="0,1,2,3,4", help="training seeds of every method")
    parser.add_argument(
        "--method-seeds",
        default="",
        help="per-method seeds overriding --seeds, e.g. 'protonet=0,1,2,3;ridge=0,1,2'",
    )
    parser.add_argument("--way", type=int, default=20, help="training way")
    parser.add_argument("--query", type=int, default=5, help="training queries per class")
    parser.add_argument("--epochs", type=int, default=20, help="the lr halves after half of them")
    parser.add_argument("--episodes-per-epoch", type=int, default=200)
    parser.add_argument("--episodes-per-batch", type=int, default=2)
    parser.add_argument("--val-episodes", type=int, default=300)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--amp", default="auto", help="--amp of training and testing")
    parser.add_argument("--test-ways", default="5,20", help="test ways (1-shot, 15 queries)")
    parser.add_argument("--test-episodes", type=int, default=2000)
    parser.add_argument("--test-seed", type=int, default=2024)
    parser.add_argument("--paired-seed", type=int, default=0, help="seed of `fewshot compare`")
    parser.add_argument(
        "--thresholds", default="95,97,98", help="5-way validation accuracies for time to accuracy"
    )
    parser.add_argument("--jobs", type=int, default=2, help="CLI processes at a time")
    parser.add_argument("--nice", type=int, default=10, help="niceness of every CLI process")
    parser.add_argument("--runs", default="runs/ehg_convergence", help="folder for run folders")
    parser.add_argument("--out", default="experiments/ehg_convergence", help="results folder")
    parser.add_argument("--data-root", default=None, help="data root (default: as fewshot's)")
    parser.add_argument(
        "--report-only", action="store_true", help="run nothing: tabulate what is finished"
    )
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    apply_smoke(args, SMOKE, ("runs",))
    # The CLI runs in --cli-dir: every path handed to it must not depend on the working folder.
    args.runs, args.out = Path(args.runs).resolve(), Path(args.out).resolve()
    if args.data_root:
        args.data_root = Path(args.data_root).resolve()
    return args


@dataclass
class Job:
    """One CLI call: its arguments, when it is done, and the jobs it waits for."""

    name: str
    argv: Callable[[], list[str]]
    done: Callable[[], bool]
    deps: list[str] = field(default_factory=list)


def jobs(args: argparse.Namespace) -> list[Job]:
    """Every job in priority order: method by method (--methods order), its seeds one after the
    other with every U side by side; the paired seed's plot and per-episode comparisons right
    after its runs (a usable result early), the across-seed comparisons after the last run.
    With too little time, the last method loses seeds first."""
    seeds, splits = method_seeds(args), ints(args.resplits)
    base, tested, ways = splits[0], splits[1:], ints(args.test_ways)
    order: list[Job] = []

    def add(name: str, argv: list[str], out: Path, deps: list[str]) -> None:
        """Queue one CLI call whose result is the file `out`."""
        order.append(Job(name, lambda: [*argv, "--out", str(out)], out.exists, deps))

    for method, values in seeds.items():
        for seed in values:
            for u in splits:
                folder = run_dir(args, method, u, seed)
                order.append(
                    Job(
                        f"train {folder.name}",
                        lambda h=method, u=u, s=seed: train_argv(args, h, u, s),
                        lambda f=folder: finished(args, f),
                    )
                )
            if seed != args.paired_seed:
                continue
            folders = [run_dir(args, method, u, seed) for u in splits]
            deps = [f"train {f.name}" for f in folders]
            labels = ["--labels", *(f"U={u}" for u in splits)]
            add(
                f"plot {method} seed {seed}",
                ["plot", *map(str, folders), *labels],
                args.out / f"curves_{method}_seed{seed}.png",
                deps,
            )
            for u in tested:
                pair = [str(run_dir(args, method, x, seed)) for x in (base, u)]
                for way in ways:
                    argv = ["compare", *pair, *test_flags(args, way)]
                    name = f"compare {method} U{u} {way}-way seed {seed}"
                    add(name, argv, pair_file(args, method, u, way), deps)
        # compare-seeds needs two seeds; one seed is only compared per episode.
        if len(values) < 2:
            continue
        deps = [f"train {run_dir(args, method, u, s).name}" for u in splits for s in values]
        for u in tested:
            a = [str(run_dir(args, method, base, s)) for s in values]
            b = [str(run_dir(args, method, u, s)) for s in values]
            for way in ways:
                argv = ["compare-seeds", "--a", *a, "--b", *b, *test_flags(args, way)]
                name = f"compare-seeds {method} U{u} {way}-way"
                add(name, argv, seeds_file(args, method, u, way, values), deps)
    return order


def launch(args: argparse.Namespace, job: Job) -> subprocess.Popen:
    """Start one CLI call under nice with one torch thread, its output in runs/logs/."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    log_dir = args.runs / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log = (log_dir / (job.name.replace(" ", "_") + ".log")).open("a")
    command = ["nice", "-n", str(args.nice), args.python, "-m", "fewshot", *job.argv()]
    log.write(f"$ {' '.join(command)}\n")
    log.flush()
    process = subprocess.Popen(
        command, cwd=args.cli_dir, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    log.close()  # the child holds its own descriptor
    return process


def record(args: argparse.Namespace, entry: dict) -> None:
    """Append one job's timing to runs/jobs.jsonl (the study's timeline)."""
    with (args.runs / "jobs.jsonl").open("a") as f:
        f.write(json.dumps(entry) + "\n")


def watch(process: subprocess.Popen, name: str, exits: queue.SimpleQueue) -> None:
    """Put `name` in `exits` once `process` has ended (run in a thread of its own)."""
    process.wait()
    exits.put(name)


def schedule(args: argparse.Namespace) -> None:
    """Run every unfinished job, at most --jobs at a time, reporting after each one ends."""
    pending = [job for job in jobs(args) if not job.done()]
    names = {job.name: job for job in jobs(args)}
    running: dict[str, tuple[subprocess.Popen, float]] = {}
    exits: queue.SimpleQueue[str] = queue.SimpleQueue()  # a job's name when its process ends
    failed: set[str] = set()
    # SIGTERM (e.g. kill PID) stops the children too; they checkpoint on SIGTERM.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    try:
        while pending or running:
            for name, (process, start) in list(running.items()):
                if process.poll() is None:
                    continue
                del running[name]
                ok = process.returncode == 0 and names[name].done()
                # The load average says how much other work shared the CPU with this job.
                entry = {"job": name, "start": start, "end": time.time(), "ok": ok}
                entry["load_average"] = os.getloadavg()[1]
                record(args, {**entry, "returncode": process.returncode})
                print(f"{time.strftime('%H:%M:%S')} {'done' if ok else 'FAILED'}: {name}")
                if not ok:
                    failed.add(name)
                report(args)
            # A job waiting on a failed one can never run.
            for job in [j for j in pending if failed & set(j.deps)]:
                pending.remove(job)
                failed.add(job.name)
                print(f"skipped (a job it needs failed): {job.name}")
            for job in list(pending):
                if len(running) >= args.jobs:
                    break
                if all(names[d].done() for d in job.deps):
                    pending.remove(job)
                    process = launch(args, job)
                    running[job.name] = (process, time.time())
                    watcher = (process, job.name, exits)
                    threading.Thread(target=watch, args=watcher, daemon=True).start()
                    print(f"{time.strftime('%H:%M:%S')} start: {job.name}", flush=True)
            if not running:  # nothing will end, so what is pending can never start
                failed.update(job.name for job in pending)
                pending.clear()
            else:
                exits.get()  # until a job ends: no polling
    finally:
        for process, _ in running.values():
            process.terminate()
        for process, _ in running.values():
            process.wait()
    if failed:
        sys.exit(f"failed: {', '.join(sorted(failed))}")


def main(argv: list[str] | None = None) -> None:
    """Run (or resume) the study, then report; --report-only just reports."""
    args = parse_args(argv)
    if not args.report_only:
        args.runs.mkdir(parents=True, exist_ok=True)
        schedule(args)
    report(args)


if __name__ == "__main__":
    main()
