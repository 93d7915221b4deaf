"""The SVM head alone: the native interior point against qpth at MetaOptNet's settings.

Forward+backward of `fewshot.heads.svm` on ready support and query embeddings (leaves with
requires_grad; loss = a fixed random linear function of the logits), and of the solver alone
on the head's ready kernel (from the kernel and the one-hot labels to alpha and back to the
kernel: the part the two solvers do not share), float32, C = 0.1,
dual_ridge = 1: solver "interior-point" (defaults: tol 1e-5 in float32, at most 50 iterations)
against solver "qpth" truncated at MetaOptNet's 15 iterations, timed in turns in one process.
For each: the largest |alpha - alpha*| against a float64 interior point solved to tol 1e-12, and
the peak memory of one forward+backward (CUDA: max_memory_allocated above what was allocated
before; CPU: the rise of the peak resident memory in a fresh process, see `print_peak_rss`).

Features are random and scaled like a trained network's: ReLU of a per-class Gaussian mean plus
per-sample Gaussian noise, scaled so that the mean ||x||^2 is --sq-norm (default 200; the zoo's
Omniglot Conv-4, models/omniglot/protonet_conv4_trainval.pt, gives 186 to its 64-d embeddings).

    python -m benchmarks.bench_svm                                 # MetaOptNet's shapes
    python -m benchmarks.bench_svm --cases 5w5s15q/1600 --repeats 5
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.bench_ehg import sync
from benchmarks.bench_throughput import device_name, interleaved
from fewshot.heads.crammer_singer import solve_crammer_singer
from fewshot.heads.episode_inputs import support_one_hot
from fewshot.heads.svm import DEFAULT_MAX_ITER, _qpth_dual, crammer_singer_dual, svm
from fewshot.runtime.allocator import retain_freed_memory
from fewshot.runtime.device import DEVICES, resolve_device

REPO = Path(__file__).resolve().parents[1]
METAOPTNET = {"C": 0.1, "dual_ridge": 1.0}
SOLVERS = {
    "interior-point": METAOPTNET,
    "qpth (15 it.)": {**METAOPTNET, "solver": "qpth", "max_iter": 15},
}
REFERENCE_TOL, REFERENCE_MAX_ITER = 1e-12, 200  # float64 reaches 1e-12 in 12-20 iterations
CASES = "5w5s15q/1600,5w5s15q/16000,20w5s15q/1600"
CASE = re.compile(r"(\d+)w(\d+)s(\d+)q/(\d+)")
# The child of the CPU memory figure: one solver's forward+backward in a fresh process.
CHILD = "import sys; from benchmarks.bench_svm import print_peak_rss; print_peak_rss(*sys.argv[1:])"
# glibc returns freed memory at once (no dynamic mmap threshold, no retained heap top), so the
# resident size follows the live memory and no freed block hides part of the peak.
RETURN_FREED = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "0"}
SPEED_GOAL, MEMORY_GOAL = 5.0, 0.25


@dataclasses.dataclass(frozen=True)
class Case:
    """One batch of episodes: its shape and the feature dimension."""

    way: int
    shot: int
    query: int
    dim: int
    episodes: int

    def __str__(self) -> str:
        """The label of the case's rows, e.g. '8 x 5w5s15q d=1600'."""
        return f"{self.episodes} x {self.way}w{self.shot}s{self.query}q d={self.dim}"


def parse_cases(text: str, episodes: int) -> list[Case]:
    """Cases from 'WAYwSHOTsQUERYq/DIM,...', each with `episodes` episodes."""
    cases = []
    for item in text.split(","):
        match = CASE.fullmatch(item.strip())
        if not match:
            raise ValueError(f"--cases: a case is WAYwSHOTsQUERYq/DIM, got {item!r}")
        cases.append(Case(*map(int, match.groups()), episodes))
    return cases


def episode_features(
    case: Case, sq_norm: float, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Seeded query [B, way*query, d] and support [B, way*shot, d] features, support labels."""
    gen = torch.Generator().manual_seed(0)
    shape = (case.episodes, case.way, case.shot + case.query, case.dim)
    means = torch.randn(case.episodes, case.way, 1, case.dim, generator=gen)
    features = (means + torch.randn(shape, generator=gen)).relu_()
    features *= (sq_norm / features.square().sum(-1).mean()).sqrt()
    support = features[:, :, : case.shot].reshape(case.episodes, -1, case.dim)
    query = features[:, :, case.shot :].reshape(case.episodes, -1, case.dim)
    labels = torch.arange(case.way).repeat_interleave(case.shot).expand(case.episodes, -1)
    return query.to(device), support.to(device), labels.to(device)


def head_step(case: Case, sq_norm: float, options: dict, device: torch.device) -> Callable:
    """A function running one forward+backward of the SVM head with these options."""
    query, support, labels = episode_features(case, sq_norm, device)
    query.requires_grad_()
    support.requires_grad_()
    weights = torch.randn(
        query.shape[0], query.shape[1], case.way, generator=torch.Generator().manual_seed(1)
    ).to(device)

    def step() -> None:
        query.grad = support.grad = None
        logits = svm(query, support, labels, case.way, case.shot, **options)
        (logits * weights).sum().backward()

    return step


def solver_step(case: Case, sq_norm: float, options: dict, device: torch.device) -> Callable:
    """A function running one forward+backward of the solver alone on the head's kernel."""
    _, support, labels = episode_features(case, sq_norm, device)
    eye = torch.eye(support.shape[1], device=device)
    kernel = (support @ support.transpose(1, 2) + options["dual_ridge"] * eye).requires_grad_()
    targets = support_one_hot(support, labels, case.way, case.shot)
    weights = torch.randn(targets.shape, generator=torch.Generator().manual_seed(1)).to(device)
    max_iter = options.get("max_iter", DEFAULT_MAX_ITER["interior-point"])

    def step() -> None:
        kernel.grad = None
        if options.get("solver") == "qpth":
            alpha = _qpth_dual(kernel, targets, options["C"], max_iter, None)
        else:
            alpha = solve_crammer_singer(kernel, targets, options["C"], None, max_iter).alpha
        (alpha * weights).sum().backward()

    return step


def errors(case: Case, sq_norm: float, device: torch.device) -> tuple[dict[str, float], str]:
    """Largest |alpha - alpha*| of each solver in float32, and a note on the native solver's
    iterations and the float64 reference's."""
    _, support, labels = episode_features(case, sq_norm, device)
    with torch.no_grad():
        alphas = {
            name: crammer_singer_dual(support, labels, case.way, case.shot, **options)
            for name, options in SOLVERS.items()
        }
        solutions = {}
        # The head's own solve (its default tol and cap) and the reference.
        runs = {
            torch.float32: (None, DEFAULT_MAX_ITER["interior-point"]),
            torch.float64: (REFERENCE_TOL, REFERENCE_MAX_ITER),
        }
        for dtype, (tol, max_iter) in runs.items():
            x = support.to(dtype)
            # The head's kernel (fewshot.heads.svm.crammer_singer_dual), for the solver's report.
            eye = torch.eye(x.shape[1], dtype=dtype, device=device)
            kernel = x @ x.transpose(1, 2) + METAOPTNET["dual_ridge"] * eye
            targets = support_one_hot(x, labels, case.way, case.shot)
            solutions[dtype] = solve_crammer_singer(kernel, targets, METAOPTNET["C"], tol, max_iter)
    reference = solutions[torch.float64]
    error = {
        name: float((alpha.double() - reference.alpha).abs().max())
        for name, alpha in alphas.items()
    }
    native = solutions[torch.float32]
    note = (
        f"interior point {native.iterations} iterations, {int(native.converged.sum())}/"
        f"{case.episodes} converged; reference float64 tol {REFERENCE_TOL:g}: "
        f"{reference.iterations} iterations, {int(reference.converged.sum())}/{case.episodes}"
        " converged"
    )
    return error, note


def cuda_peak(step: Callable[[], None], device: torch.device) -> float:
    """MiB allocated at the peak of one call of `step` above what was allocated before."""
    sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    step()
    sync(device)
    return (torch.cuda.max_memory_allocated(device) - before) / 2**20


def status_kib(field: str) -> int:
    """A field of /proc/self/status (VmRSS, VmHWM), in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def print_peak_rss(solver: str, case_json: str, sq_norm: str) -> None:
    """In a fresh process: print the rise of the peak resident memory (MiB) during one
    forward+backward, after a small warm-up call of the same solver (it loads the code the
    call touches: libraries' pages, qpth's import) and with the peak reset (clear_refs 5)."""
    case = Case(**json.loads(case_json))
    options = SOLVERS[solver]
    device = torch.device("cpu")
    tiny = Case(case.way, 1, 1, 8, 1)
    head_step(tiny, float(sq_norm), options, device)()
    step = head_step(case, float(sq_norm), options, device)
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    before = status_kib("VmRSS")
    step()
    print((status_kib("VmHWM") - before) / 2**10)


def cpu_peak(solver: str, case: Case, sq_norm: float) -> float:
    """The peak resident-memory rise of one forward+backward, measured in a fresh process."""
    out = subprocess.run(
        [sys.executable, "-c", CHILD, solver, json.dumps(dataclasses.asdict(case)), str(sq_norm)],
        cwd=REPO,
        env={**os.environ, **RETURN_FREED},
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.split()[-1])


def bench_case(case: Case, args, device: torch.device) -> dict[str, dict[str, float]]:
    """Print the rows of one case; return each solver's seconds, error and peak MiB."""
    steps = {name: head_step(case, args.sq_norm, opts, device) for name, opts in SOLVERS.items()}
    seconds = interleaved(steps, args.repeats, device)
    alone = {name: solver_step(case, args.sq_norm, opts, device) for name, opts in SOLVERS.items()}
    solver_seconds = interleaved(alone, args.repeats, device)
    error, note = errors(case, args.sq_norm, device)
    if device.type == "cuda":
        # A fresh step, as in the CPU's fresh process: no gradients of earlier calls are held.
        peak = {
            name: cuda_peak(head_step(case, args.sq_norm, options, device), device)
            for name, options in SOLVERS.items()
        }
    else:
        peak = {name: cpu_peak(name, case, args.sq_norm) for name in SOLVERS}
    native = "interior-point"
    for name in SOLVERS:
        label = str(case) if name == native else ""
        print(
            f"{label:26} {name:15} {seconds[name]:9.4f} {seconds[name] / seconds[native]:8.2f}x "
            f"{error[name]:11.1e} {peak[name]:10.1f} {peak[name] / peak[native]:8.2f}x",
            flush=True,
        )
    print(f"{'':26} {note}", flush=True)
    print(
        f"{'':26} solver alone: "
        + ", ".join(f"{name} {solver_seconds[name]:.4f} s" for name in SOLVERS)
        + f" ({solver_seconds['qpth (15 it.)'] / solver_seconds[native]:.2f}x)",
        flush=True,
    )
    return {
        name: {
            "s": seconds[name],
            "solver s": solver_seconds[name],
            "error": error[name],
            "MiB": peak[name],
        }
        for name in SOLVERS
    }


def print_goals(results: dict[Case, dict[str, dict[str, float]]], device: torch.device) -> None:
    """The goals, with whether this run met them where it measures them."""
    native, qpth = SOLVERS
    print(f"\ngoals ({device.type} run):")
    print(
        f"- CPU: the solver alone (interior-point) >= {SPEED_GOAL:g}x faster than qpth at equal or"
        " better accuracy (the head's figure beside it: both solvers share its kernel and logits)"
    )
    print(f"- CPU: interior-point peak memory <= {MEMORY_GOAL:g} x qpth's at 20-way 5-shot")
    print(
        "- GPU: a whole SVM training step <= 1.3x the ridge step: bench_throughput's (b) rows "
        "'train_step svm' against 'train_step ridge' (cuda_checks.sh part bench_throughput)"
    )
    for case, result in results.items():
        speed = result[qpth]["s"] / result[native]["s"]
        solver_speed = result[qpth]["solver s"] / result[native]["solver s"]
        accurate = result[native]["error"] <= result[qpth]["error"]
        memory = result[native]["MiB"] / result[qpth]["MiB"]
        verdict = ""
        if device.type == "cpu":
            met = solver_speed >= SPEED_GOAL and accurate
            verdict = f"speed goal {'met' if met else 'NOT met'}"
            if (case.way, case.shot) == (20, 5):
                verdict += f", memory goal {'met' if memory <= MEMORY_GOAL else 'NOT met'}"
        print(
            f"  {case!s:26} interior point {solver_speed:.1f}x faster (the head {speed:.1f}x), "
            f"{'as or more' if accurate else 'less'} accurate, {memory:.3f}x the memory  {verdict}"
        )


def main() -> None:
    """Parse the options, print one pair of rows per case, then the goals."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=CASES, help=f"WAYwSHOTsQUERYq/DIM,... (default {CASES})")
    parser.add_argument("--episodes", type=int, default=8, help="episodes per call (MetaOptNet's)")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds (median)")
    parser.add_argument("--sq-norm", type=float, default=200.0, help="mean ||x||^2 of a feature")
    parser.add_argument("--device", default="auto", choices=DEVICES)
    args = parser.parse_args()
    try:
        cases = parse_cases(args.cases, args.episodes)
    except ValueError as e:
        parser.error(str(e))
    if importlib.util.find_spec("qpth") is None:
        parser.error('qpth is not installed: pip install "fewshot[qpth]"')
    device = resolve_device(args.device)
    retain_freed_memory()  # as fewshot train runs: timings without page faults of freed memory
    memory = (
        "max_memory_allocated above what was allocated before"
        if device.type == "cuda"
        else "rise of the peak RSS, in a fresh process"
    )
    print(
        f"device: {device_name(device)}; torch {torch.__version__}; float32, C=0.1, dual_ridge=1"
        f"\nfeatures: ReLU(class mean + noise), mean ||x||^2 = {args.sq_norm:g}; time: forward+"
        f"backward, median of {args.repeats} rounds in turns; error: max |alpha - alpha*| against "
        f"float64 at tol {REFERENCE_TOL:g}; peak MiB: one forward+backward, {memory}"
    )
    print(
        f"{'case':26} {'solver':15} {'seconds':>9} {'vs native':>9} {'error':>11} "
        f"{'peak MiB':>10} {'vs native':>9}"
    )
    results = {case: bench_case(case, args, device) for case in cases}
    print_goals(results, device)


if __name__ == "__main__":
    main()
