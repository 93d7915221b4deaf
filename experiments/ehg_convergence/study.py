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
import math
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

from experiments.smoke import add_smoke_flag, apply_smoke

# The U flag of `fewshot train`, in one place: the library may rename it.
EHG_FLAG = "--resplits"
# Every method a study can train: its name in tables, and the `fewshot train` flags picking it.
# The adaptation methods run the MAML paper's Omniglot setting: stride-2 Conv-4, one inner step
# of 0.4 in training, three at test time.
MAML_SETTING = [
    "--backbone-options", json.dumps({"downsample": "stride"}),
    "--method-options", json.dumps({"inner_steps": 1, "inner_lr": 0.4, "eval_inner_steps": 3}),
]  # fmt: skip
METHODS = {
    "protonet": ("ProtoNet", ["--head", "protonet"]),
    "ridge": ("ridge", ["--head", "ridge"]),
    "anil": ("ANIL", ["--method", "anil", *MAML_SETTING]),
    "maml": ("MAML", ["--method", "maml", *MAML_SETTING]),
}
# --smoke: two seeds (compare-seeds needs two), one small step per epoch, a few episodes, and
# the CLI processes at the test suite's priority.
SMOKE = {
    "seeds": "0,1", "method_seeds": "", "way": 5, "query": 2, "epochs": 2,
    "episodes_per_epoch": 2, "episodes_per_batch": 2, "val_episodes": 2, "test_episodes": 4,
    "nice": 0,
}  # fmt: skip


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


def data_flags(args: argparse.Namespace) -> list[str]:
    """--data-root for the CLI, when the study was given one."""
    return ["--data-root", str(args.data_root)] if args.data_root else []


def ints(text: str) -> list[int]:
    """'0,1,2' -> [0, 1, 2]."""
    return [int(x) for x in text.split(",") if x]


def method_seeds(args: argparse.Namespace) -> dict[str, list[int]]:
    """The training seeds of every method."""
    seeds = {method: ints(args.seeds) for method in args.methods.split(",")}
    for item in filter(None, args.method_seeds.split(";")):
        method, values = item.split("=")
        seeds[method] = ints(values)
    return seeds


def shown(path: Path) -> str:
    """A path as the results show it: relative to the working folder (no machine paths)."""
    return os.path.relpath(path)


def run_dir(args: argparse.Namespace, method: str, u: int, seed: int) -> Path:
    """The run folder of one model."""
    return args.runs / f"{method}_U{u}_s{seed}"


def metrics(folder: Path) -> list[dict]:
    """The finished epochs of a run (empty before its first)."""
    path = folder / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def finished(args: argparse.Namespace, folder: Path) -> bool:
    """Whether a run has logged its last epoch."""
    return any(row["epoch"] == args.epochs for row in metrics(folder))


def train_argv(args: argparse.Namespace, method: str, u: int, seed: int) -> list[str]:
    """`fewshot train` arguments: continue the run, or start it afresh."""
    folder = run_dir(args, method, u, seed)
    if (folder / "last.pt").exists():
        return ["train", "--resume", str(folder / "last.pt")]
    # Killed before its first checkpoint (or never started): nothing to keep.
    return [
        "train", "--overwrite", "--dataset", "omniglot", "--backbone", "conv4", *METHODS[method][1],
        "--way", str(args.way), "--shot", "1", "--query", str(args.query),
        "--val-way", "5", "--val-shot", "1", "--val-query", "15",
        "--val-episodes", str(args.val_episodes), "--epochs", str(args.epochs),
        "--episodes-per-epoch", str(args.episodes_per_epoch),
        "--episodes-per-batch", str(args.episodes_per_batch), EHG_FLAG, str(u),
        "--optimizer", "adam", "--lr", str(args.lr), "--weight-decay", "0",
        "--lr-schedule", json.dumps([[args.epochs // 2, 0.5]]), "--amp", args.amp,
        "--seed", str(seed), "--device", "cpu", "--out", str(folder), *data_flags(args),
    ]  # fmt: skip


def test_flags(args: argparse.Namespace, way: int) -> list[str]:
    """The shared test episodes of one way (1-shot, 15 queries)."""
    return [
        "--way", str(way), "--shot", "1", "--query", "15",
        "--episodes", str(args.test_episodes), "--seed", str(args.test_seed),
        "--device", "cpu", "--amp", args.amp, *data_flags(args),
    ]  # fmt: skip


def seeds_file(args: argparse.Namespace, method: str, u: int, way: int, seeds: list[int]) -> Path:
    """The cached `compare-seeds` JSON of U vs the baseline on one test way."""
    base = ints(args.resplits)[0]
    tag = "-".join(map(str, seeds))
    name = f"{method}_U{u}-U{base}_{way}w1s_{args.test_episodes}ep_seed{args.test_seed}_s{tag}"
    return args.runs / "tests" / f"compare_seeds_{name}.json"


def pair_file(args: argparse.Namespace, method: str, u: int, way: int) -> Path:
    """The cached `compare` JSON of U vs the baseline for the paired seed."""
    base = ints(args.resplits)[0]
    name = f"{method}_U{u}-U{base}_{way}w1s_{args.test_episodes}ep_seed{args.test_seed}"
    return args.runs / "tests" / f"compare_{name}_s{args.paired_seed}.json"


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


def t_interval(values: list[float]) -> tuple[float, float]:
    """Mean ± the t-based 95% half-width (nan with fewer than two values)."""
    from scipy import stats  # slow to import: only when reporting

    n = len(values)
    mean = sum(values) / n if n else math.nan
    if n < 2:
        return mean, math.nan
    sd = math.sqrt(sum((x - mean) ** 2 for x in values) / (n - 1))
    return mean, float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n)


def paired_t(a: list[float], b: list[float]) -> dict:
    """b - a paired: mean ± t half-width and the paired t-test's p-value."""
    from scipy import stats

    d = [y - x for x, y in zip(a, b, strict=True)]
    mean, half = t_interval(d)
    p = float(stats.ttest_rel(b, a).pvalue) if len(d) >= 2 else math.nan
    return {"mean": mean, "ci95": half, "p_value": p, "n": len(d)}


def reach(rows: list[dict], threshold: float, episodes_per_epoch: int) -> int | None:
    """Training episodes at the first validation at or above `threshold` (None: never)."""
    hit = next((r["epoch"] for r in rows if r["val_acc"] >= threshold), None)
    return None if hit is None else hit * episodes_per_epoch


def collect(args: argparse.Namespace) -> dict:
    """Everything finished so far: runs, curves, time to accuracy and the cached tests."""
    splits, thresholds = ints(args.resplits), [float(x) for x in args.thresholds.split(",")]
    timeline = args.runs / "jobs.jsonl"
    timings = (
        [json.loads(line) for line in timeline.read_text().splitlines()]
        if (timeline.exists())
        else []
    )
    walls = {t["job"]: t["end"] - t["start"] for t in timings if t["ok"]}
    out: dict = {"runs": [], "methods": {}}
    for method, seeds in method_seeds(args).items():
        cells: dict = {}
        for u in splits:
            runs = []
            for seed in seeds:
                folder = run_dir(args, method, u, seed)
                rows = metrics(folder)
                if not rows:
                    continue
                best = max(rows, key=lambda r: r["val_acc"])
                run = {
                    "method": method, "U": u, "seed": seed, "folder": shown(folder),
                    "finished": finished(args, folder), "epochs_done": len(rows),
                    "precision": rows[-1].get("precision"),
                    "train_seconds": sum(r["seconds"] for r in rows),
                    "wall_seconds": walls.get(f"train {folder.name}"),
                    "best_epoch": best["epoch"], "best_val": best["val_acc"],
                    "val_acc": [r["val_acc"] for r in rows],
                    "train_loss": [r["train_loss"] for r in rows],
                    "reach": {f"{t:g}": reach(rows, t, args.episodes_per_epoch)
                              for t in thresholds},
                }  # fmt: skip
                runs.append(run)
            out["runs"] += runs
            cells[f"U{u}"] = [r for r in runs if r["finished"]]
        out["methods"][method] = {"time_to_accuracy": time_to_accuracy(args, cells, thresholds)}
        out["methods"][method]["plateau"] = plateau(args, cells)
        out["methods"][method]["tests"] = tests(args, method, seeds)
    return out


def time_to_accuracy(args: argparse.Namespace, cells: dict, thresholds: list[float]) -> dict:
    """Per threshold and U: episodes to reach it, mean ± t over the seeds that reached it, and
    U - baseline paired over the seeds where both arms reached it."""
    base = f"U{ints(args.resplits)[0]}"
    result: dict = {}
    for t in thresholds:
        key = f"{t:g}"
        entry = result.setdefault(key, {})
        for u, runs in cells.items():
            hits = [r["reach"][key] for r in runs if r["reach"][key] is not None]
            mean, half = t_interval(hits) if hits else (math.nan, math.nan)
            entry[u] = {"mean": mean, "ci95": half, "reached": len(hits), "runs": len(runs)}
        for u, runs in cells.items():
            if u == base:
                continue
            a = {r["seed"]: r["reach"][key] for r in cells[base]}
            b = {r["seed"]: r["reach"][key] for r in runs}
            both = sorted(s for s in set(a) & set(b) if a[s] is not None and b[s] is not None)
            if both:
                entry[f"{u}-{base}"] = paired_t([a[s] for s in both], [b[s] for s in both])
    return result


def plateau(args: argparse.Namespace, cells: dict) -> dict:
    """Per U: mean validation accuracy over the last quarter of the epochs and its gain over
    the quarter before, averaged over finished seeds (near 0: the curve has flattened)."""
    q = max(1, args.epochs // 4)
    result = {}
    for u, runs in cells.items():
        if not runs:
            continue
        last = [sum(r["val_acc"][-q:]) / q for r in runs]
        before = [sum(r["val_acc"][-2 * q : -q]) / q for r in runs]
        result[u] = {
            "last_quarter": t_interval(last),
            "gain_over_previous_quarter": t_interval(
                [x - y for x, y in zip(last, before, strict=True)]
            ),
            "best_epoch": [r["best_epoch"] for r in runs],
        }
    return result


def correct(accuracies: list[float], way: int) -> list[int]:
    """Per-episode accuracies (fractions) as numbers of correct queries (15 per class)."""
    return [round(a * way * 15) for a in accuracies]


def tests(args: argparse.Namespace, method: str, seeds: list[int]) -> dict:
    """The cached compare-seeds / compare results of one method, per tested U and way."""
    base, result = ints(args.resplits)[0], {}
    for u in ints(args.resplits)[1:]:
        for way in ints(args.test_ways):
            entry: dict = {}
            path = seeds_file(args, method, u, way, seeds)
            if path.exists():
                data = json.loads(path.read_text())
                accs = {arm: [m["accuracy"] for m in data[arm]] for arm in "ab"}
                entry["seeds"] = seeds
                entry[f"U{base}"] = {"accuracies": accs["a"], "mean_ci95": t_interval(accs["a"])}
                entry[f"U{u}"] = {"accuracies": accs["b"], "mean_ci95": t_interval(accs["b"])}
                # Per episode, as correct-query counts: every paired figure can be recomputed.
                entry["correct"] = {
                    f"{arm_u} seed {s}": correct(m["accuracies"], way)
                    for arm, arm_u in (("a", f"U{base}"), ("b", f"U{u}"))
                    for s, m in zip(seeds, data[arm], strict=True)
                }
                # compare-seeds reports fractions: percent like everything else here.
                d = data["difference"]
                entry["across_seeds"] = {
                    **d, "mean": 100 * d["mean"], "ci95": 100 * d["ci95"],
                    "higher_in": sum(y > x for x, y in zip(accs["a"], accs["b"], strict=True)),
                }  # fmt: skip
            path = pair_file(args, method, u, way)
            if path.exists():
                data = json.loads(path.read_text())
                d = data["difference"]
                entry["per_episode"] = {
                    **d, "mean": 100 * d["mean"], "ci95": 100 * d["ci95"], "seed": args.paired_seed,
                    f"U{base}": data["a"]["accuracy"], f"U{u}": data["b"]["accuracy"],
                }  # fmt: skip
            result[f"U{u}-U{base} {way}w1s"] = entry
    return result


def pm(mean: float, half: float, digits: int = 2) -> str:
    """'95.74 ± 0.21' ('-' when missing)."""
    if math.isnan(mean):
        return "-"
    return f"{mean:.{digits}f}" if math.isnan(half) else f"{mean:.{digits}f} ± {half:.{digits}f}"


def signed(d: dict | None) -> str:
    """'+0.92 ± 0.31 (p = 0.002)'."""
    if not d:
        return "-"
    p = f"p = {d['p_value']:.2g}" if d["p_value"] > 0 else "p < 1e-300"
    return f"{d['mean']:+.2f} ± {d['ci95']:.2f} ({p})"


def markdown(args: argparse.Namespace, data: dict) -> str:
    """The tables of results.md."""
    ways, base = ints(args.test_ways), ints(args.resplits)[0]
    episodes = args.epochs * args.episodes_per_epoch
    precisions = sorted({str(r["precision"]) for r in data["runs"]})
    lines = [
        f"Omniglot (Vinyals split), Conv-4, trained {args.way}-way 1-shot {args.query}-query, "
        f"{episodes} episodes ({episodes // args.episodes_per_batch} steps of "
        f"{args.episodes_per_batch}), Adam {args.lr:g} halved after epoch {args.epochs // 2} of "
        f"{args.epochs}, best of {args.epochs} validations on {args.val_episodes} 5-way 1-shot "
        f"episodes; precision {', '.join(precisions)} (--amp {args.amp}). Tested on the same "
        f"{args.test_episodes} seeded episodes per way (seed {args.test_seed}, 15 queries). "
        "Accuracies in %, ± the t-based 95% interval across training seeds.",
        "",
        "## Test accuracy and U5 − U1",
        "",
        "| method | test | seeds | U = 1 | U = 5 | U5 − U1 across seeds | higher in | "
        f"per episode (seed {args.paired_seed}) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for method, h in data["methods"].items():
        for key, t in h["tests"].items():
            u = key.split("-")[0]
            way = key.split()[1].removesuffix("w1s")
            pair = t.get("per_episode")
            if "across_seeds" in t:
                d = t["across_seeds"]
                lines.append(
                    f"| {METHODS[method][0]} | {way}-way 1-shot | {len(t['seeds'])} | "
                    f"{pm(*t[f'U{base}']['mean_ci95'])} | {pm(*t[u]['mean_ci95'])} | {signed(d)} "
                    f"| {d['higher_in']}/{d['n']} | {signed(pair)} |"
                )
            elif pair:
                # One seed only: its two models, no interval across seeds.
                lines.append(
                    f"| {METHODS[method][0]} | {way}-way 1-shot | 1 (seed {pair['seed']}) | "
                    f"{pair[f'U{base}']:.2f} | {pair[u]:.2f} | - | - | {signed(pair)} |"
                )
    lines += [
        "",
        "## Time to accuracy (training episodes to the first 5-way validation at or above it)",
        "",
        f"Validation every {args.episodes_per_epoch} episodes on {args.val_episodes} episodes; "
        "mean ± t interval over the seeds that reached it (reached/finished runs); the "
        "difference is paired by seed over seeds where both arms reached it.",
        "",
        "| method | validation accuracy | U = 1 | U = 5 | U5 − U1 |",
        "|---|---|---|---|---|",
    ]
    for method, h in data["methods"].items():
        for thr, e in h["time_to_accuracy"].items():
            if not any(v.get("runs") for v in e.values()):
                continue
            cell = [
                f"{pm(e[u]['mean'], e[u]['ci95'], 0)} ({e[u]['reached']}/{e[u]['runs']})"
                for u in (f"U{base}", "U5")
                if u in e
            ]
            diff = e.get(f"U5-U{base}")
            diff_text = (
                f"{diff['mean']:+.0f} ± {diff['ci95']:.0f} (p = {diff['p_value']:.2g}, "
                f"{diff['n']} seeds)"
                if diff and diff["n"] >= 2 and diff["ci95"] > 0
                else "- (same in every seed)"
                if diff and diff["n"] >= 2
                else "-"
            )
            lines.append(f"| {METHODS[method][0]} | {thr} % | {' | '.join(cell)} | {diff_text} |")
    lines += [
        "",
        "## Plateau (5-way validation accuracy, mean over finished seeds)",
        "",
        f"Last quarter: mean over the last {max(1, args.epochs // 4)} validations; gain: that "
        "minus the mean of the quarter before.",
        "",
        "| method | U | last quarter | gain over previous quarter | best epoch per seed |",
        "|---|---|---|---|---|",
    ]
    for method, h in data["methods"].items():
        for u, p in h["plateau"].items():
            lines.append(
                f"| {METHODS[method][0]} | {u[1:]} | {pm(*p['last_quarter'])} | "
                f"{pm(*p['gain_over_previous_quarter'])} | {p['best_epoch']} |"
            )
    lines += [
        "",
        "## Every run",
        "",
        "| method | U | seed | epochs | best val (epoch) | training-step min | wall min | "
        + " | ".join(f"test {w}-way" for w in ways)
        + " |",
        "|---|---|---|---|---|---|---|" + "---|" * len(ways),
    ]
    for r in data["runs"]:
        accs = []
        for way in ways:
            test = data["methods"][r["method"]]["tests"].get(f"U5-U{base} {way}w1s", {})
            u = f"U{r['U']}"
            arm, seeds = test.get(u, {}), test.get("seeds", [])
            pair = test.get("per_episode", {})
            if r["seed"] in seeds:
                accs.append(f"{arm['accuracies'][seeds.index(r['seed'])]:.2f}")
            elif pair.get("seed") == r["seed"]:
                accs.append(f"{pair[u]:.2f}")
            else:
                accs.append("-")
        wall = f"{r['wall_seconds'] / 60:.1f}" if r["wall_seconds"] else "-"
        lines.append(
            f"| {METHODS[r['method']][0]} | {r['U']} | {r['seed']} | {r['epochs_done']} | "
            f"{r['best_val']:.2f} ({r['best_epoch']}) | {r['train_seconds'] / 60:.1f} | {wall} | "
            + " | ".join(accs)
            + " |"
        )
    return "\n".join(lines) + "\n"


def curves(args: argparse.Namespace, data: dict) -> None:
    """curves_<method>.png: 5-way validation accuracy against training episodes, every U's mean
    over finished seeds (band: min-max over seeds), full range and the last half."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for method in data["methods"]:
        if not any(r["method"] == method and r["finished"] for r in data["runs"]):
            continue
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for u in ints(args.resplits):
            runs = [
                r for r in data["runs"] if r["method"] == method and r["U"] == u and r["finished"]
            ]
            if not runs:
                continue
            x = [(e + 1) * args.episodes_per_epoch for e in range(args.epochs)]
            by_epoch = list(zip(*(r["val_acc"] for r in runs), strict=True))
            mean = [sum(v) / len(v) for v in by_epoch]
            for ax in axes:
                ax.plot(x, mean, marker=".", label=f"U = {u} (seeds: {len(runs)})")
                lo, hi = [min(v) for v in by_epoch], [max(v) for v in by_epoch]
                ax.fill_between(x, lo, hi, alpha=0.2)
        half = args.epochs // 2 * args.episodes_per_epoch
        axes[1].set_xlim(half, args.epochs * args.episodes_per_epoch)
        tail = [
            v
            for r in data["runs"]
            if r["method"] == method and r["finished"]
            for v in r["val_acc"][args.epochs // 2 :]
        ]
        if tail:
            axes[1].set_ylim(min(tail) - 0.2, max(tail) + 0.2)
        for ax, title in zip(axes, ("all of training", "second half (lr halved)"), strict=True):
            ax.set(xlabel="training episodes", ylabel="5-way 1-shot validation accuracy (%)")
            ax.set_title(f"{METHODS[method][0]}: {title}")
            ax.grid(alpha=0.3)
            ax.legend()
        fig.tight_layout()
        fig.savefig(args.out / f"curves_{method}.png", dpi=110)
        plt.close(fig)


def report(args: argparse.Namespace) -> None:
    """Write results.json, results.md and the curves from whatever has finished."""
    data = collect(args)
    settings = {k: shown(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    settings["python"] = Path(args.python).name  # the interpreter's name, not this machine's path
    data = {"settings": {**settings, "ehg_flag": EHG_FLAG}, **data}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(data, indent=1) + "\n")
    (args.out / "results.md").write_text(markdown(args, data))
    curves(args, data)


def main(argv: list[str] | None = None) -> None:
    """Run (or resume) the study, then report; --report-only just reports."""
    args = parse_args(argv)
    if not args.report_only:
        args.runs.mkdir(parents=True, exist_ok=True)
        schedule(args)
    report(args)


if __name__ == "__main__":
    main()
