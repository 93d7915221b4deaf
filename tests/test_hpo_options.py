"""What `fewshot hpo TASK` accepts, it honours (issue 31): every flag of every task, under every
hypergradient method, is either refused before any data is read, in one line naming the flag
and what rules it out (the method, or the data set), or it changes the result of a tiny real
run. The matrix is every case (a task on its data) x every method x every flag."""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any

import pytest
import torch

from fewshot.cli.main import build_parser
from fewshot.hpo.cli import TASKS
from fewshot.hpo.optimize import METHODS
from fewshot.hpo.tasks import bias_variance, cleaning, image_regularization, regularization
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.settings import flag_name

# Where and how a run works, not what it computes: not part of the matrix.
PLACES = {"out", "overwrite", "data_root", "device", "seed"}
# A tiny budget in the step counts each method reads.
STEPS = {
    "rhg": "--inner-steps 3",
    "trhg": "--inner-steps 3 --truncate 2",
    "aid-fp": "--inner-steps 3 --solver-steps 2",
    "aid-cg": "--inner-steps 3 --solver-steps 2",
    "oehg": "",
}
# Valid values other than the tiny runs' (which take the defaults of what they do not name).
SHARED = {"inner_steps": 4, "truncate": 1, "solver_steps": 3, "outer_lr": 0.05, "outer_steps": 3}
SHARED |= {"resplits": 2, "inner_lr": 0.03}
LIBSVM = {"model": "svm", "per_parameter": True, "gamma": 0.3, "oehg_inner_steps": 2}
LIBSVM |= {"init_lam": 0.1, "holdout": "random"}  # heart's default holdout is the file head
IMAGES = {"model": "mlp", "dataset": "fashion-mnist", "batch": 50}
# case: (task, the words of its tiny run, the values to try, the extra words some values need)
CASES: dict[str, tuple[str, str, dict[str, Any], dict[str, str]]] = {
    "heart": (
        "regularization",
        "--dataset heart --model logistic --outer-steps 2",
        {**SHARED, **LIBSVM, "dataset": "ionosphere"},
        {},
    ),
    "a1a": (  # a set with a test file: --holdout has nothing to choose
        "regularization",
        "--dataset a1a --model logistic --outer-steps 2",
        {**SHARED, **LIBSVM, "dataset": "heart"},
        {},
    ),
    "cleaning": (
        "cleaning",
        "--dataset mnist --model sr --n-train 1600 --n-val 200 --n-test 300 --outer-steps 2 "
        "--retrain-steps 2 --batch 100 --val-batch 100 --device cpu --data-root {root}",
        {**SHARED, **IMAGES, "noise": 0.3, "n_train": 1700, "n_val": 250, "n_test": 250}
        | {"val_batch": 50, "threshold": 0.3, "extra_val": 1, "retrain_steps": 3},
        # OEHG draws its splits from the deployed model every 50 outer steps; the first draw,
        # from the untrained model, moves nothing: --extra-val acts from the second on.
        {"extra_val": "--outer-steps 51 --noise 0.1"},
    ),
    "image-regularization": (
        "image-regularization",
        "--dataset mnist --model sr --outer-steps 2 --device cpu --data-root {root}",
        {**SHARED, **IMAGES, "batch": 128},
        {},
    ),
    "bias-variance": (
        "bias-variance",
        "--resplits 1 2 --inner-steps 2 --repeats 2",
        {"resplits": [1, 3], "inner_steps": 3, "repeats": 3},
        {},
    ),
}
TASK = {task.name: task for task in TASKS}


def flags(task: str) -> list[str]:
    """The fields of a task's settings that are options of what it computes."""
    fields = dataclasses.fields(TASK[task].settings)
    return [f.name for f in fields if f.metadata.get("flag") and f.name not in PLACES | {"method"}]


def methods(task: str) -> list[str | None]:
    """The methods of a task (None: a task without --method)."""
    names = {f.name for f in dataclasses.fields(TASK[task].settings)}
    return list(METHODS) if "method" in names else [None]


def words(name: str, value: Any) -> list[str]:
    """Command-line words giving field `name` the value `value`."""
    if value is True:
        return [flag_name(name)]
    values = value if isinstance(value, list) else [value]
    return [flag_name(name), *map(str, values)]


MATRIX = [
    (case, method, name)
    for case, (task, *_) in CASES.items()
    for method in methods(task)
    for name in flags(task)
]


@pytest.fixture(scope="module")
def read_once(digits_root):
    """Every reader returns what it read the first time (the matrix reads the same sets
    hundreds of times); small data where the task fixes its size: image regularization
    observes 1000 images (not 10000) and tests on 500, the bias-variance table takes 2 lambdas
    (not 50). One torch thread: on a busy CPU, threads that wait for each other over tensors
    this small make the runs 5x slower."""
    read = functools.cache(cleaning.load_image_dataset)
    draw = functools.partial(image_regularization.draw_observed_data, n_observed=1000, n_test=500)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as patch:
        for module in (cleaning, image_regularization):
            patch.setattr(module, "load_image_dataset", read)
        patch.setattr(image_regularization, "draw_observed_data", functools.cache(draw))
        patch.setattr(regularization, "load_dataset", functools.cache(regularization.load_dataset))
        patch.setattr(bias_variance, "LAMBDAS", 2)
        yield str(digits_root)
    torch.set_num_threads(threads)


@functools.cache
def outcome(task: str, command: tuple[str, ...]) -> Any:
    """The result of `fewshot hpo TASK COMMAND` (timings and the settings left out), or its
    one-line refusal."""
    args = build_parser().parse_args(["hpo", task, *command, "--out", "unused"])
    try:
        (settings,) = args._command.build_settings(args)
    except FewshotError as refused:
        return str(refused)
    result = TASK[task].run(settings, TASK[task].load(settings), None)
    if isinstance(result, list):
        return [dataclasses.asdict(row) for row in result]
    return {
        k: v
        for k, v in dataclasses.asdict(result).items()
        if k != "settings" and "seconds" not in k
    }


@pytest.mark.slow  # about 300 tiny runs: 20 s on a busy 2-core CPU
@pytest.mark.parametrize(
    ("case", "method", "name"), MATRIX, ids=["-".join(map(str, p)) for p in MATRIX]
)
def test_a_flag_is_refused_or_changes_the_run(read_once, case, method, name):
    task, tiny, values, needs = CASES[case]
    assert name in values, f"no value of {flag_name(name)} to try for {case}: add one"
    base = [*tiny.format(root=read_once).split(), *needs.get(name, "").split()]
    if method is not None:
        base += ["--method", method, *STEPS[method].split()]
    given = words(name, values[name])
    changed = outcome(task, (*base, *given))
    if isinstance(changed, str):  # refused when built: before any data is read
        assert len(changed.splitlines()) == 1, changed
        assert flag_name(name) in changed or " ".join(given[1:]) in changed, changed
        ruled_out = rf"^{flag_name(name)} does not apply to --(dataset|model) "
        assert f"--method {method}" in changed or re.match(ruled_out, changed), changed
    else:
        baseline = outcome(task, tuple(base))
        assert not isinstance(baseline, str), baseline
        assert changed != baseline, f"{' '.join(given)} was accepted but changed nothing"


@pytest.mark.parametrize("task", [t.name for t in TASKS if methods(t.name) != [None]])
def test_the_help_of_a_flag_some_methods_ignore_names_who_reads_it(task):
    settings_class = TASK[task].settings
    case = next(c for c, (t, *_) in CASES.items() if t == task)
    tiny = CASES[case][1].format(root="unread").split()
    unused = {}
    for method in METHODS:
        args = build_parser().parse_args(["hpo", task, *tiny, "--method", method, "--out", "o"])
        (settings,) = args._command.build_settings(args)
        unused[method] = settings.unused()[f"--method {method}"]
    for f in dataclasses.fields(settings_class):
        readers = [m for m in METHODS if f.name not in unused[m]]
        if len(readers) == len(METHODS):
            continue
        named = [m for m in METHODS if re.search(rf"(?<![\w-]){m}(?![\w-])", f.metadata["help"])]
        others = [m for m in METHODS if m not in readers]
        assert named in (readers, others), (f.name, f.metadata["help"])
