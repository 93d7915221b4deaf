"""Shared fixtures: the shipped Omniglot splits, small generated image sets, and the data root of
the real data sets, whose absence skips only the tests of their numbers (counted at the end)."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections import Counter
from pathlib import Path

import pytest
from datafiles import cut_omniglot_root, write_digits

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


def tree_rss_kib(root: int) -> int:
    """The resident memory (kB) of process `root` and all its descendants, summed: an upper
    bound on what they hold at once (shared library pages count once per process); read from
    /proc/PID/statm, which takes no lock of the process (0 where /proc cannot tell)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            ppid = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        children.setdefault(ppid, []).append(int(entry.name))
    total, pending = 0, [root]
    page_kib = os.sysconf("SC_PAGE_SIZE") // 1024
    while pending:
        pid = pending.pop()
        pending += children.get(pid, [])
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page_kib
        except (OSError, ValueError, IndexError):
            continue
    return total


class MemorySampler(threading.Thread):
    """The peak of the suite's memory held at once: `tree_rss_kib` of the test process (the
    controller, with its xdist workers and their subprocesses) sampled every second, and the
    tests that were running then (what to look at when the peak grows)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak_kib = 0
        self.running: set[str] = set()  # test ids, kept by the hooks below under `lock`
        self.lock = threading.Lock()
        self.at_peak: list[str] = []
        self.done = threading.Event()

    def run(self) -> None:
        """Sample until `done` is set."""
        while not self.done.wait(1.0):
            rss = tree_rss_kib(os.getpid())
            if rss > self.peak_kib:
                with self.lock:
                    self.peak_kib, self.at_peak = rss, sorted(self.running)


SAMPLER = MemorySampler()


def pytest_configure(config) -> None:
    """In the controller (not in an xdist worker): start sampling the suite's memory, and
    give the suite a cache folder of its own (decoded Omniglot, runtime.cache), shared by the
    workers and the commands they start (they inherit the environment), removed at the end."""
    if not hasattr(config, "workerinput"):
        SAMPLER.start()
        os.environ["FEWSHOT_CACHE"] = tempfile.mkdtemp(prefix="fewshot-test-cache-")


def pytest_unconfigure(config) -> None:
    """Remove the suite's cache folder (controller)."""
    if not hasattr(config, "workerinput"):
        shutil.rmtree(os.environ.pop("FEWSHOT_CACHE"), ignore_errors=True)


def pytest_collection_modifyitems(items: list) -> None:
    """The tests marked slow first, in their order (a stable sort): the two workers share
    the minutes-long end-to-end runs while hundreds of short tests remain, and those even out
    the end, rather than one worker finishing a long run while the other idles."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    """A test began (in the controller too: xdist relays its workers' starts)."""
    with SAMPLER.lock:
        SAMPLER.running.add(nodeid)


def pytest_runtest_logfinish(nodeid: str, location: object) -> None:
    """A test ended."""
    with SAMPLER.lock:
        SAMPLER.running.discard(nodeid)


def pytest_terminal_summary(terminalreporter) -> None:
    """Report the suite's peak memory; say how many tests skipped for a missing real data set,
    and how to provide it. Under xdist the skips reach the controller as reports whose
    longrepr ends in the reason."""
    SAMPLER.done.set()
    if SAMPLER.peak_kib:
        terminalreporter.write_sep("-", "memory")
        terminalreporter.write_line(
            f"peak memory: {SAMPLER.peak_kib / 2**20:.1f} GiB at once (the resident memory of "
            "the suite's processes summed, sampled every second)"
        )
        for nodeid in SAMPLER.at_peak:
            terminalreporter.write_line(f"  running then: {nodeid}")
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
    classes = {"train": 24, "val": 24, "test": 24}
    return cut_omniglot_root(tmp_path_factory.mktemp("data"), REPO_DATA, classes)
