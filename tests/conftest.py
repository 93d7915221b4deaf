"""Shared fixtures: the shipped Omniglot splits, small generated image sets, and the data root of
the real data sets, whose absence skips only the tests of their numbers (counted at the end)."""

from __future__ import annotations

import os
import resource
from collections import Counter
from pathlib import Path

import pytest
from datafiles import write_digits

import fewshot.cli.main
from fewshot.datasets import REPO_DATA, load_split
from fewshot.datasets.fetch import DATASETS

REPO = Path(__file__).resolve().parents[1]
# Where tests of a real data set's numbers look for it: $FEWSHOT_DATA (read once at start-up,
# before any test points it at a small folder of its own), else the project's shared data beside
# the repository, else the repository's data/, where `fewshot data fetch` puts it by default.
REAL_DATA_ROOTS = (
    [Path(os.environ["FEWSHOT_DATA"])]
    if os.environ.get("FEWSHOT_DATA")
    else [REPO.parent / "shared" / "data", REPO_DATA]
)
# The start of the reason of every skip for a missing real data set: the summary counts these.
MISSING = "real data set missing:"


@pytest.fixture(autouse=True)
def no_caller_data_root(monkeypatch):
    """Every test but those of real data sets reads the repository's data/ or folders of its
    own, whatever the caller's FEWSHOT_DATA says (the subprocesses a test starts too)."""
    monkeypatch.delenv("FEWSHOT_DATA", raising=False)


@pytest.fixture(autouse=True, scope="session")
def commands_return_freed_memory():
    """A test worker runs hundreds of commands in one process: `main` would make it keep its
    peak heap for good (retain_freed_memory, for training speed), and two workers grown that
    way leave too little memory for the subprocesses of the end-to-end tests (the OOM killer
    took a worker). tests/test_allocator.py checks the setting in processes of its own."""
    patch = pytest.MonkeyPatch()
    patch.setattr(fewshot.cli.main, "retain_freed_memory", lambda: False)
    yield
    patch.undo()


@pytest.fixture(scope="session")
def real_data():
    """`real_data(NAME)`: the data root that holds every file of `fewshot data fetch NAME`, or
    a skip of the test that asked, counted in the summary."""

    def root_of(name: str) -> Path:
        for root in REAL_DATA_ROOTS:
            if all((root / remote.path).is_file() for remote in DATASETS[name]):
                return root
        pytest.skip(f"{MISSING} {name} (fewshot data fetch {name}, or set FEWSHOT_DATA)")

    return root_of


def peak_rss_gib() -> tuple[float, float]:
    """This process's peak resident memory and its largest finished subprocess's, in GiB."""
    kib = [
        resource.getrusage(who).ru_maxrss
        for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    ]
    return kib[0] / 2**20, kib[1] / 2**20


# Each xdist worker's peaks, sent to the controller when the worker finishes.
WORKER_PEAKS: dict[str, tuple[float, float]] = {}


def pytest_sessionfinish(session) -> None:
    """On an xdist worker, send its memory peaks to the controller."""
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["peak_rss_gib"] = peak_rss_gib()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """On the controller, keep a finished worker's memory peaks."""
    peaks = getattr(node, "workeroutput", {}).get("peak_rss_gib")
    if peaks is not None:
        WORKER_PEAKS[node.gateway.id] = tuple(peaks)


def memory_line() -> str:
    """The suite's peak memory: each process's peak and their sum, with each worker's largest
    subprocess: a bound on what the suite held at once while a worker runs one subprocess at
    a time (torchrun's ranks are the exception: two at once, of a few hundred MB each)."""
    own, child = peak_rss_gib()
    # Under xdist the controller's finished subprocesses are the workers, counted below.
    processes = {"controller": (own, 0.0 if WORKER_PEAKS else child), **WORKER_PEAKS}
    total = sum(own + child for own, child in processes.values())
    parts = ", ".join(
        f"{name} {own:.1f} (+ subprocess {child:.1f})" for name, (own, child) in processes.items()
    )
    return f"peak memory: at most {total:.1f} GiB at once ({parts}; GiB of resident memory)"


def pytest_terminal_summary(terminalreporter) -> None:
    """Report the suite's peak memory; say how many tests skipped for a missing real data set,
    and how to provide it. Under xdist the skips reach the controller as reports whose
    longrepr ends in the reason."""
    terminalreporter.write_sep("-", "memory")
    terminalreporter.write_line(memory_line())
    missing: Counter[str] = Counter()
    for report in terminalreporter.stats.get("skipped", []):
        reason = str(report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr)
        if MISSING in reason:
            missing[reason.split(MISSING, 1)[1].split()[0]] += 1
    if missing:
        names = ", ".join(f"{name} ({count})" for name, count in sorted(missing.items()))
        terminalreporter.write_sep("-", "real data sets")
        terminalreporter.write_line(
            f"{missing.total()} tests skipped: their real data set is not in "
            f"{' or '.join(map(str, REAL_DATA_ROOTS))}: {names}. Provide it with "
            "`fewshot data fetch NAME` (into $FEWSHOT_DATA, else data/; --data-root DIR to "
            "choose), or set FEWSHOT_DATA to a folder that holds it."
        )


@pytest.fixture(scope="session")
def digits_root(tmp_path_factory) -> Path:
    """A data root with small learnable MNIST and Fashion-MNIST files (2000 training, 600 test
    images each), for tests of options and mechanics rather than of the real sets' numbers."""
    return write_digits(tmp_path_factory.mktemp("digits"), n_train=2000, n_test=600)


@pytest.fixture(scope="session")
def omniglot_test():
    """The Vinyals test split of the shipped Omniglot (1692 classes)."""
    return load_split("omniglot", "test", REPO_DATA)


@pytest.fixture(scope="session")
def omniglot_val():
    """The Vinyals validation split of the shipped Omniglot (688 classes)."""
    return load_split("omniglot", "val", REPO_DATA)


@pytest.fixture(scope="session")
def tiny_omniglot_root(tmp_path_factory):
    """A data root with the real Omniglot files but split lists cut to 24 classes each."""
    root = tmp_path_factory.mktemp("data")
    folder = root / "omniglot"
    (folder / "splits" / "vinyals").mkdir(parents=True)
    source = REPO_DATA / "omniglot"
    for name in ("images_background.npz", "images_evaluation.npz", "omniglot_index.csv"):
        (folder / name).symlink_to(source / name)
    for split in ("train", "val", "test"):
        lines = (source / "splits" / "vinyals" / f"{split}.txt").read_text().split()
        (folder / "splits" / "vinyals" / f"{split}.txt").write_text("\n".join(lines[:24]) + "\n")
    return root
