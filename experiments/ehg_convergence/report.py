"""The study's results from whatever has finished: statistics, results.json, results.md, curves."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from experiments.ehg_convergence.layout import (
    EHG_FLAG,
    METHODS,
    finished,
    ints,
    method_seeds,
    metrics,
    pair_file,
    run_dir,
    seeds_file,
    shown,
)


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
