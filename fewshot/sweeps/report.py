"""A sweep's report: what failed or was not run, each run's accuracy on each evaluated shape,
the suite's leaderboard, and the arms of the compared key paired training seed by training seed
(`fewshot compare-seeds`' statistics), written as OUT/report.md and OUT/report.json. Each
value of the compared key is paired with each later one: B − A for every pair (A before B)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from fewshot.evaluation.stats import paired_seeds_ci, seeds_ci
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.io import atomic_write_json, atomic_write_text
from fewshot.sweeps.executors import LOG
from fewshot.sweeps.jobs import DONE_STATE, FAILED_STATE, Job, Sweep, summary
from fewshot.sweeps.spec import SEED, Spec, key_parts

ENDED = (DONE_STATE, FAILED_STATE)


@dataclass(frozen=True)
class SuiteScores:
    """What the suite's leaderboard gives the report: the leaderboard as Markdown, its file,
    and each run's accuracy (percent) in each cell, keyed (run, SUITE/CELL)."""

    markdown: str
    path: Path
    accuracy: dict[tuple[str, str], float]


def write_report(spec: Spec, sweep: Sweep, suite: SuiteScores | None) -> str:
    """Write OUT/report.json and OUT/report.md; return the Markdown."""
    done = [job for job in sweep.evaluations if job.kind == "eval" and job.state == DONE_STATE]
    evaluations = [shape_result(job) for job in done]
    scores = {(e["run"], e["shape"]): e["accuracy"] for e in evaluations}
    cells = [shape.label for shape in spec.evaluate.shapes] if spec.evaluate else []
    if suite is not None:
        scores |= suite.accuracy
        cells += list(dict.fromkeys(cell for _, cell in suite.accuracy))
    comparisons, notes = compare(spec, sweep.training, scores, cells) if spec.compare else ([], [])
    trained = sweep.trained()
    record = {
        "name": sweep.name,
        "folder": str(sweep.folder),
        "jobs": {job.name: job.state for job in sweep.jobs},
        "failed": {
            job.name: str(job.folder / LOG) for job in sweep.jobs if job.state == FAILED_STATE
        },
        "not_run": [
            f"{job.name}: not run" + ("" if job.run in trained else ", its training is not done")
            for job in sweep.evaluations
            if job.state not in ENDED
        ],
        "evaluations": evaluations,
        "leaderboard": None if suite is None else str(suite.path),
        "comparisons": comparisons,
        "notes": notes,
    }
    markdown = report_markdown(spec, summary(sweep), record, suite)
    atomic_write_json(record, sweep.folder / "report.json")
    atomic_write_text(markdown, sweep.folder / "report.md")
    return markdown


def shape_result(job: Job) -> dict:
    """A done eval job's result: its run, shape, accuracy ± 95% CI (percent) and file."""
    try:
        record = json.loads(job.result.read_text(encoding="utf-8"))
        accuracy, ci95, episodes = record["accuracy"], record["ci95"], record["episodes"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise FewshotError(f"{job.name}: its result {job.result} cannot be read ({e})") from None
    result = {"run": job.run, "shape": job.label, "accuracy": accuracy, "ci95": ci95}
    return result | {"episodes": episodes, "result": str(job.result)}


def compare(
    spec: Spec, training: list[Job], scores: dict[tuple[str, str], float], cells: list[str]
) -> tuple[list[dict], list[str]]:
    """Each value A of the compared key against each later value B, in each group of the other
    matrix keys (seed aside) and each cell: the arms' per-seed accuracies paired seed by seed
    (the seeds both arms have), with each arm's mean ± t interval and the mean difference ± t
    interval and the paired t-test's p-value. Returns the comparisons and notes on those with
    fewer than two paired seeds."""
    key = spec.compare
    arms, seeds = key_parts(spec, key), key_parts(spec, SEED)
    index: dict[tuple, str] = {}  # (group, arm, seed): the run
    for job in training:
        values = dict(job.parts)
        group = tuple(part for k, part in job.parts if k not in (key, SEED))
        index[group, values[key], values[SEED]] = job.run
    groups = list(dict.fromkeys(group for group, _, _ in index))
    comparisons, notes = [], []
    for group in groups:
        present = [arm for arm in arms if any((group, arm, s) in index for s in seeds)]
        pairs = [(a, b) for i, a in enumerate(present) for b in present[i + 1 :]]
        for (first, other), cell in ((pair, cell) for pair in pairs for cell in cells):
            runs = [(index.get((group, first, s)), index.get((group, other, s)), s) for s in seeds]
            paired = [
                (scores[a, cell], scores[b, cell], s)
                for a, b, s in runs
                if (a, cell) in scores and (b, cell) in scores
            ]
            label = f"{other} − {first}" + (f" ({','.join(group)})" if group else "") + f" {cell}"
            if len(paired) < 2:
                notes.append(f"{label}: {len(paired)} paired seeds, too few to compare")
                continue
            a, b, paired_seeds = (list(values) for values in zip(*paired, strict=True))
            difference = paired_seeds_ci(a, b)
            (a_mean, a_ci95), (b_mean, b_ci95) = seeds_ci(a), seeds_ci(b)
            comparisons.append(
                {
                    "key": key,
                    "a": first,
                    "b": other,
                    "group": list(group),
                    "cell": cell,
                    "seeds": paired_seeds,
                    "a_accuracies": a,
                    "b_accuracies": b,
                    "a_mean": a_mean,
                    "a_ci95": a_ci95,
                    "b_mean": b_mean,
                    "b_ci95": b_ci95,
                    "difference": difference.mean,
                    "difference_ci95": difference.ci95,
                    "p_value": difference.p_value,
                }
            )
    return comparisons, notes


def report_markdown(spec: Spec, jobs: str, record: dict, suite: SuiteScores | None) -> str:
    """The report as Markdown, under the line `jobs` that counts the jobs."""
    lines = [f"# Sweep {record['name']}", ""]
    if spec.about:
        lines += [" ".join(spec.about.split()), ""]
    lines += [f"{jobs}.", ""]
    if record["failed"] or record["not_run"]:
        lines += ["## Failed", ""]
        lines += [f"- {name}: failed, log {log}" for name, log in record["failed"].items()]
        lines += [f"- {line}" for line in record["not_run"]]
        lines.append("")
    if record["evaluations"]:
        lines += evaluation_lines(spec, record["evaluations"])
    if suite is not None:
        lines += [suite.markdown.rstrip(), ""]
    if spec.compare:
        lines += comparison_lines(spec.compare, record["comparisons"], record["notes"])
    return "\n".join(lines).rstrip() + "\n"


def evaluation_lines(spec: Spec, evaluations: list[dict]) -> list[str]:
    """A table of each run's accuracy ± 95% CI on each shape."""
    shapes = [shape.label for shape in spec.evaluate.shapes]
    found = {(e["run"], e["shape"]): e for e in evaluations}
    runs = list(dict.fromkeys(e["run"] for e in evaluations))
    lines = ["## Accuracy (fewshot eval)", ""]
    lines += [
        f"Mean accuracy ± 95% CI (%) of each run's {spec.evaluate.checkpoint}.pt over "
        f"{spec.evaluate.episodes} test "
        f"episodes of each shape (seed {spec.evaluate.seed}).",
        "",
        "| run | " + " | ".join(shapes) + " |",
        "|---|" + "---|" * len(shapes),
    ]
    for run in runs:
        cells = [found.get((run, shape)) for shape in shapes]
        shown = [f"{e['accuracy']:.2f} ± {e['ci95']:.2f}" if e else "—" for e in cells]
        lines.append(f"| {run} | " + " | ".join(shown) + " |")
    return [*lines, ""]


def comparison_lines(key: str, comparisons: list[dict], notes: list[str]) -> list[str]:
    """A table of the compared arms."""
    lines = [f"## {key} compared across training seeds", ""]
    lines += [
        "Each arm's mean accuracy over the training seeds ± its t interval (%), and the mean "
        "difference B − A paired seed by seed ± its t interval, with the paired t-test's "
        "p-value (the statistics of fewshot compare-seeds).",
        "",
        "| group | cell | A | B | A: mean | B: mean | B − A | p | seeds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in comparisons:
        group = ",".join(c["group"]) or "all"
        lines.append(
            f"| {group} | {c['cell']} | {c['a']} | {c['b']} "
            f"| {c['a_mean']:.2f} ± {c['a_ci95']:.2f} | {c['b_mean']:.2f} ± {c['b_ci95']:.2f} "
            f"| {c['difference']:+.2f} ± {c['difference_ci95']:.2f} | {c['p_value']:.3g} "
            f"| {len(c['seeds'])} |"
        )
    lines.append("")
    return lines + [f"- {note}" for note in notes]
