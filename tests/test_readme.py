"""The `fewshot` commands of the README and the documentation pages (docs/): every one parses
and builds, and the tour under "Using it" (docs/getting-started.md) runs end to end."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
import yaml
from PIL import Image

from fewshot.benchmark.leaderboard import build_leaderboard
from fewshot.benchmark.results import STORED, CellResult, read_results
from fewshot.benchmark.suites import load_suite
from fewshot.cli.main import COMMANDS, build_parser, main
from fewshot.evaluation.manifests import Manifest, ManifestInfo, write_manifest
from fewshot.evaluation.stats import ci95
from fewshot.runtime.io import load_checkpoint

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
GETTING_STARTED = "docs/getting-started.md"
# The README first, then every page of the documentation site, as paths from the repository.
PAGES = [
    "README.md",
    *sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").rglob("*.md")),
]
SHELL_FENCES = {"bash", "sh", "shell"}

# Placeholders of the pages, as a whole argument or a path's first component, and what they
# stand for here (run in a folder that holds `models` and a tiny trained run in runs/omni).
PLACEHOLDERS = {
    "REPO": ".",
    "DATA": "data",
    "DIR": "runs/omni",
    "RUN_FOLDER": "runs/omni",
    "A": "runs/omni/best.pt",
    "B": "runs/omni/last.pt",
    "W": "20",
    "K": "5",
    "IMAGES": "images",
    "SET": "isic",
    "DOWNLOAD": "download",
    "FOLDER": "arranged",
}
# Inline spans of the pages that name a command with one of its flags but are not meant to be run.
FRAGMENTS = {"fewshot eval --per-episode", "fewshot hpo NAME"}
# Every command path and every group above one ("hpo"), longest first.
NAMES = sorted(
    {c.path[:depth] for c in COMMANDS for depth in range(1, len(c.path) + 1)}, key=len, reverse=True
)
MUST_APPEAR = [
    ("train",),
    ("pretrain",),
    ("eval",),
    ("compare",),
    ("compare-seeds",),
    ("plot",),
    ("hpo", "regularization"),
    ("hpo", "cleaning"),
    ("hpo", "bias-variance"),
]
TINY_TRAIN = [
    "--epochs", "1", "--episodes-per-epoch", "2", "--episodes-per-batch", "1",
    "--val-episodes", "2", "--way", "5", "--query", "2", "--device", "cpu",
]  # fmt: skip
TINY_EPISODES = ["--episodes", "4", "--device", "cpu"]
RUN_FILES = ("best.pt", "last.pt", "metrics.jsonl", "config.json")


class Command(NamedTuple):
    """One `fewshot` command of a page: where it is, how it is launched, its arguments."""

    line: int  # 1-based line of the page where it starts
    block: int | None  # line of the opening fence of its shell block, None outside one
    launcher: str | None  # "torchrun" for `torchrun ... -m fewshot ...`, else None
    argv: list[str]  # the arguments after `fewshot`, placeholders in place
    page: str = "README.md"  # the file it is in, from the repository root

    @property
    def path(self) -> tuple[str, ...]:
        """The command (or group) the arguments start with, e.g. ("hpo", "cleaning")."""
        return next((n for n in NAMES if tuple(self.argv[: len(n)]) == n), ())

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}-{'-'.join(self.path) or 'unknown'}"


def code_lines(lines: list[str]) -> list[tuple[int, int | None, str]]:
    """(line number, opening fence line or None, text) of every shell line: in a bash fence, or
    in an indented code block outside fences, backslash continuations joined."""
    found, fence, fence_line, pending = [], None, None, None
    for number, line in enumerate(lines, 1):
        if line.lstrip().startswith("```"):
            fence = None if fence is not None else line.strip()[3:].strip()
            fence_line = number if fence is not None else None
            continue
        previous = lines[number - 2] if number > 1 else ""
        indented = fence is None and line.startswith("    ") and line.strip() != ""
        indented = indented and (previous.strip() == "" or pending is not None)
        if fence not in SHELL_FENCES and not indented:
            continue
        text = line.strip()
        if pending is not None:
            start, block, head = pending
            text, pending = f"{head} {text}", None
        else:
            start, block = number, fence_line
        if text.endswith("\\"):
            pending = (start, block, text[:-1].rstrip())
            continue
        found.append((start, block, text))
    return found


def fewshot_argv(text: str) -> tuple[str | None, list[str]] | None:
    """(launcher, arguments after `fewshot`) of a shell line that runs fewshot, else None."""
    if not re.match(r"(fewshot|torchrun|python3? -m fewshot)\s", text):
        return None
    tokens = shlex.split(text, comments=True)
    if tokens[0] == "fewshot":
        return None, tokens[1:]
    for i in range(len(tokens) - 1):
        if tokens[i : i + 2] == ["-m", "fewshot"]:
            return (tokens[0] if tokens[0] == "torchrun" else None), tokens[i + 2 :]
    return None


def substitute(argv: list[str]) -> list[str]:
    """The pages' placeholders replaced by paths and values of this test."""
    out = []
    for token in argv:
        name, colon, value = token.rpartition(":")  # NAME:ROOT as --extra-data takes it
        head, sep, rest = value.partition("/")
        value = PLACEHOLDERS[head] + sep + rest if head in PLACEHOLDERS else value
        out.append(name + colon + value)
    return out


def prose(text: str, skip: set[int] = frozenset()) -> str:
    """The text with fenced blocks (fences included) and the lines in skip blanked out."""
    fenced, kept = False, []
    for number, line in enumerate(text.splitlines(), 1):
        fence = line.lstrip().startswith("```")
        fenced = fenced != fence
        kept.append("" if fenced or fence or number in skip else line)
    return "\n".join(kept)


def readme_commands(text: str = README, page: str = "README.md") -> list[Command]:
    """Every `fewshot` command of a page, in order: shell blocks, indented code lines and
    inline `fewshot ...` spans that give arguments (the bare command names are prose)."""
    commands = []
    code = code_lines(text.splitlines())
    for number, block, line in code:
        parsed = fewshot_argv(line)
        if parsed:
            commands.append(Command(number, block, parsed[0], substitute(parsed[1]), page))
    # Inline spans, in the text left after fenced blocks and code lines are blanked out.
    skip = {number for number, _, _ in code}
    prose_text = prose(text, skip)
    for m in re.finditer(r"`([^`]+)`", prose_text):
        span = " ".join(m.group(1).split())
        if not span.startswith("fewshot ") or span in FRAGMENTS:
            continue
        line = prose_text.count("\n", 0, m.start()) + 1
        command = Command(line, None, None, span.split()[1:], page)
        if len(command.argv) > len(command.path):  # more than a command's name
            commands.append(command._replace(argv=substitute(shlex.split(span)[1:])))
    return sorted(commands, key=lambda c: c.line)


def using_it_block(commands: list[Command]) -> list[Command]:
    """The commands of the first shell block under "## Using it" of the getting-started page."""
    lines = (REPO / GETTING_STARTED).read_text().splitlines()
    start = lines.index("## Using it")
    fence = next(n for n, line in enumerate(lines[start:], start + 1) if line.strip() == "```bash")
    return [c for c in commands if c.page == GETTING_STARTED and c.block == fence]


# The plug-in tutorial's commands name the plug-ins of the package it builds: tests/test_plugins.py
# installs that package and runs them.
PLUGIN_PAGE = "docs/guide/your-own-method.md"
COMMANDS_OF_PAGES = [
    c
    for page in PAGES
    if page != PLUGIN_PAGE
    for c in readme_commands((REPO / page).read_text(), page)
]


def tiny_run(folder: Path, data_root: Path) -> None:
    """A few-step training run into folder."""
    argv = ["train", *TINY_TRAIN, "--out", str(folder), "--data-root", str(data_root)]
    assert main(argv) == 0


@pytest.fixture(scope="module")
def readme_dir(tmp_path_factory, tiny_omniglot_root):
    """A working folder for the pages' relative paths: `models` from the repository, a
    tiny trained run in runs/omni (what --resume and the checkpoint placeholders point at) and
    a folder data set of RGB images in images/, an empty download/, and a manifest of
    episodes in bench/."""
    folder = tmp_path_factory.mktemp("readme")
    (folder / "models").symlink_to(REPO / "models")
    for split in ("train", "val", "test"):
        for name in ("a", "b"):
            (folder / "images" / split / f"{split}_{name}").mkdir(parents=True)
            Image.new("RGB", (32, 32)).save(folder / "images" / split / f"{split}_{name}" / "0.png")
    (folder / "download").mkdir()  # data arrange's input; its output, arranged/, is made by it
    tiny_run(folder / "runs" / "omni", tiny_omniglot_root)
    # A manifest where the bench page's commands find one (settings read only its header).
    info = ManifestInfo("omniglot", "test", 5, 1, 15, 2, 0, "labels", "images")
    index = torch.zeros(2, 5, 16, dtype=torch.long)
    manifest = Manifest(info, index, torch.zeros(2, 5, dtype=torch.long))
    write_manifest(manifest, folder / "bench" / "omniglot-v1" / "manifests" / "5w1s.npz")
    return folder


def test_extractor_finds_every_kind_of_command():
    paths = [c.path for c in COMMANDS_OF_PAGES]
    missing = [" ".join(p) for p in MUST_APPEAR if p not in paths]
    assert not missing, f"commands of the pages not found by the extractor: {missing}"
    assert len(COMMANDS_OF_PAGES) >= 12
    # One of each source: a continued shell line, an indented code line, an inline span.
    first = next(c for c in COMMANDS_OF_PAGES if c.page == GETTING_STARTED and c.block)
    assert first.path == ("train",) and "--config" in first.argv and "--out" in first.argv
    hpo = [c for c in COMMANDS_OF_PAGES if c.path == ("hpo", "regularization")]
    assert hpo and hpo[0].argv[-2:] == ["--out", "runs/hpo"]
    assert any(c.block is None and c.path == ("hpo", "bias-variance") for c in COMMANDS_OF_PAGES)
    assert [c.launcher for c in COMMANDS_OF_PAGES].count("torchrun") >= 1


def test_extractor_joins_continuations_and_drops_comments():
    text = "\n".join(
        [
            "Run it:",
            "",
            "```bash",
            "# a comment line",
            "fewshot train --way 5 \\",
            "    --shot 1   # trailing comment",
            "torchrun --nproc-per-node 2 -m fewshot eval --checkpoint DIR/best.pt",
            "```",
            "",
            "      fewshot plot RUN_FOLDER --out c.png",
            "",
            "Prose with `fewshot train` and `fewshot eval --per-episode` and `fewshot hpo",
            "bias-variance --resplits 1 2`.",
        ]
    )
    found = [(c.line, c.block, c.launcher, c.argv) for c in readme_commands(text)]
    assert found == [
        (5, 3, None, ["train", "--way", "5", "--shot", "1"]),
        (7, 3, "torchrun", ["eval", "--checkpoint", "runs/omni/best.pt"]),
        (10, None, None, ["plot", "runs/omni", "--out", "c.png"]),
        (12, None, None, ["hpo", "bias-variance", "--resplits", "1", "2"]),
    ]


def test_fragments_are_still_in_the_pages():
    text = "\n".join(prose((REPO / page).read_text()) for page in PAGES)
    spans = {" ".join(s.split()) for s in re.findall(r"`([^`]+)`", text)}
    assert spans >= FRAGMENTS, "drop the FRAGMENTS entries that the pages no longer have"


@pytest.mark.parametrize("command", COMMANDS_OF_PAGES, ids=lambda c: c.id)
def test_readme_command_builds(command, readme_dir, monkeypatch):
    monkeypatch.chdir(readme_dir)
    unknown = [
        t
        for t in command.argv
        if re.fullmatch(r"[A-Z][A-Z_]*", t.rpartition(":")[2].partition("/")[0])
    ]
    assert not unknown, f"{command.page}:{command.line}: unknown placeholders {unknown}"
    try:
        args = build_parser().parse_args(command.argv)
    except SystemExit:  # argparse printed why
        pytest.fail(f"{command.page}:{command.line}: fewshot {shlex.join(command.argv)} is refused")
    assert args._command.path == command.path
    settings = args._command.build_settings(args)  # a FewshotError names the bad value
    assert [type(s) for s in settings] == list(args._command.settings)


@pytest.mark.slow
def test_using_it_runs_end_to_end(tmp_path, tiny_omniglot_root, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEWSHOT_DATA", str(tiny_omniglot_root))
    (tmp_path / "models").symlink_to(REPO / "models")
    block = using_it_block(COMMANDS_OF_PAGES)
    assert [c.path for c in block if c.launcher is None] == [
        ("train",),
        ("train",),
        ("eval",),
        ("train",),
        ("compare",),
        ("compare-seeds",),
        ("plot",),
    ]
    first_train = block[0].argv
    runs: list[Path] = []
    for command in block:
        if command.launcher == "torchrun":
            continue  # several processes: tests/test_distributed.py
        args = build_parser().parse_args(command.argv)
        *_, settings = args._command.build_settings(args)
        name, resume = command.path[0], getattr(args, "resume", None)
        extra = {"eval": TINY_EPISODES, "compare": TINY_EPISODES, "compare-seeds": TINY_EPISODES}
        extra |= {"train": ["--epochs", "2"] if resume else TINY_TRAIN}
        if name == "train" and not resume:
            runs.append(Path(settings.out))
        elif name == "compare-seeds":  # the seeds' runs: the block's first train, U = 1 and 5
            for arm, resplits in ((settings.a, "1"), (settings.b, "5")):
                for seed, folder in enumerate(arm):
                    argv = [*first_train, *TINY_TRAIN, "--seed", str(seed), "--out", folder]
                    assert main([*argv, "--resplits", resplits]) == 0, folder
                    runs.append(Path(folder))
        capsys.readouterr()
        assert main([*command.argv, *extra.get(name, [])]) == 0, f"{command.page}:{command.line}"
        out = capsys.readouterr().out
        if name == "train" and resume:
            metrics = Path(resume).parent / "metrics.jsonl"
            assert [json.loads(r)["epoch"] for r in metrics.read_text().splitlines()] == [1, 2]
        elif name == "eval":  # the JSON result next to the checkpoint
            checkpoint = Path(settings.checkpoint)
            (result,) = checkpoint.parent.glob("eval_*.json")
            record = json.loads(result.read_text())
            assert record["episodes"] == 4 and record["checkpoint"] == str(checkpoint)
            assert (record["way"], record["shot"], record["query"]) == (5, 1, 15)
            assert f"accuracy: {record['accuracy']:.2f} ± {record['ci95']:.2f} %" in out
        elif name in ("compare", "compare-seeds"):
            assert "B - A: " in out
        elif name == "plot":
            assert Path(settings.out).read_bytes().startswith(b"\x89PNG")
    assert len(runs) == 8
    for run in runs:
        missing = [f for f in RUN_FILES if not (run / f).is_file()]
        assert not missing, f"{run} lacks {missing}"
    resplits = [json.loads((run / "config.json").read_text())["resplits"] for run in runs]
    assert resplits == [1, 5, 1, 1, 1, 5, 5, 5]


TUTORIAL = "## A tutorial: ten minutes on a CPU"


def tutorial_steps() -> list[tuple[int, str, Command | str]]:
    """The getting-started tutorial's steps in page order: ("shell", a fewshot command of its
    shell blocks) and ("python", the code of a Python block)."""
    text = (REPO / GETTING_STARTED).read_text()
    lines = text.splitlines()
    start, end = lines.index(TUTORIAL) + 1, lines.index("## Using it") + 1
    steps: list[tuple[int, str, Command | str]] = [
        (c.line, "shell", c)
        for c in COMMANDS_OF_PAGES
        if c.page == GETTING_STARTED and c.block and start < c.line < end
    ]
    for m in re.finditer(r"^```python\n(.*?)^```", text, flags=re.S | re.M):
        line = text.count("\n", 0, m.start()) + 1
        if start < line < end:
            steps.append((line, "python", m.group(1)))
    return sorted(steps, key=lambda step: step[0])


@pytest.mark.slow
def test_the_tutorial_runs_as_written(tmp_path, tiny_omniglot_root, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEWSHOT_DATA", str(tiny_omniglot_root))
    (tmp_path / "models").symlink_to(REPO / "models")
    steps = tutorial_steps()
    kinds = [step.path[0] if kind == "shell" else kind for _, kind, step in steps]
    assert kinds == ["train", "train", "eval", "compare", "show", "plot", "python", "predict"]
    tiny = {"train": TINY_TRAIN, "eval": TINY_EPISODES, "compare": TINY_EPISODES}
    for line, kind, step in steps:
        if kind == "python":
            exec(compile(step, f"{GETTING_STARTED}:{line}", "exec"), {})
            continue
        capsys.readouterr()
        assert main([*step.argv, *tiny.get(step.path[0], [])]) == 0, f"{GETTING_STARTED}:{line}"
        out = capsys.readouterr().out
        if step.path == ("compare",):
            assert "B - A: " in out
    for picture in ("worst.png", "curves.png"):
        assert Path(picture).read_bytes().startswith(b"\x89PNG")
    assert len(list(Path("my_support").iterdir())) == 5
    rows = Path("predictions.csv").read_text().splitlines()
    assert len(rows) == 1 + 15  # a header, a row per query image
    for picture in ("getting-started-worst.png", "getting-started-curves.png"):
        assert f"]({picture})" in (REPO / GETTING_STARTED).read_text()


def test_the_plugin_page_opens_with_its_tested_commands():
    # tests/test_plugins.py runs the page's bash block; its opening example repeats some of it.
    text = (REPO / PLUGIN_PAGE).read_text()
    (opening,) = re.findall(r"^```sh\n(.*?)^```$", text, flags=re.M | re.S)
    (tested, *_) = re.findall(r"^```bash\n(.*?)^```$", text, flags=re.M | re.S)
    assert text.index(opening) < text.index("## ")
    assert set(opening.splitlines()) <= set(tested.splitlines())


# The README's headline tables, each number read from the result file it comes from.
# The papers' numbers of the reproduction table (its accuracies are the stored results').
PAPERS = REPO / "experiments" / "omniglot_reproduction" / "papers.yaml"
EHG_SEEDS = REPO / "experiments" / "ehg_seeds"  # a sweep spec: its report.json and config.json
SHAPES = [(5, 1), (5, 5), (20, 1), (20, 5)]
EHG_HEADS = {"protonet": "ProtoNet", "ridge": "ridge", "svm": "SVM"}


def marked_table(text: str, name: str) -> list[list[str]]:
    """The cells of the Markdown table between `<!-- name -->` and `<!-- /name -->`, header and
    separator rows left out."""
    block = text.split(f"<!-- {name} -->\n", 1)[1].split(f"<!-- /{name} -->", 1)[0]
    rows = [line for line in block.splitlines() if line.startswith("|")]
    return [[c.strip() for c in row.strip("|").split("|")] for row in rows[2:]]


def reproduction_rows() -> list[tuple[str, tuple[int, int], CellResult | None, str]]:
    """The reproduction table's rows in papers.yaml's order: (method, shape, the method's
    stored omniglot-v1 result of that cell or None, the paper's number as the tables show
    it). Every zoo model of the stored results (a checkpoint in models/omniglot) is a row."""
    stored = read_results(STORED / "omniglot-v1", "omniglot-v1", True)
    papers = yaml.safe_load(PAPERS.read_text())
    zoo = {r.name for r in stored if r.record.get("checkpoint", "").startswith("models/omniglot/")}
    assert zoo <= set(papers), zoo - set(papers)
    by = {(r.name, r.cell): r for r in stored}
    return [
        (method, (w, s), by.get((method, f"{w}w{s}s")), str(paper[f"{w}w{s}s"] or "—"))
        for method, paper in papers.items()
        for w, s in SHAPES
    ]


def here(result: CellResult | None) -> str:
    """A stored result's accuracy as the tables show it: '98.75 ± 0.12', or — unshipped."""
    if result is None:
        return "—"
    acc = result.accuracies()
    return f"{100 * float(acc.mean()):.2f} ± {100 * ci95(acc):.2f}"


def test_readme_reproduction_table_is_the_stored_results():
    # Each accuracy from the zoo's stored omniglot-v1 results (the one source of the numbers),
    # the papers' numbers from the reproduction study's papers.yaml.
    cells: dict[str, list[str]] = {}
    for method, _, result, paper in reproduction_rows():
        cells.setdefault(method, []).append(f"{here(result)} ({paper})")
    expected = [[method, *shapes] for method, shapes in cells.items()]
    assert marked_table(README, "readme-reproduction") == expected
    episodes = {cell.episodes for cell in load_suite("omniglot-v1").cells}
    assert f"same {episodes.pop()} seeded test" in " ".join(README.split())


def test_results_page_reproduction_table_is_the_stored_results():
    # Beside each accuracy, the training of its shipped checkpoint: its episodes, and its
    # epochs' minutes and precision as its training history records them.
    expected = []
    for method, (way, shot), result, paper in reproduction_rows():
        trained = ["", ""]
        if result is not None:
            checkpoint = load_checkpoint(REPO / result.record["checkpoint"])
            config, history = checkpoint["config"], checkpoint["progress"]["history"]
            minutes = sum(row.get("seconds", 0.0) for row in history) / 60
            episodes = checkpoint["progress"]["epoch"] * config["episodes_per_epoch"]
            trained = [f"{episodes:,}", f"{minutes:.0f} min, {history[-1]['precision']}"]
        expected.append([method, f"{way}-way {shot}-shot", here(result), paper, *trained])
    results = (REPO / "docs" / "results.md").read_text()
    assert marked_table(results, "reproduction-table") == expected


def test_results_page_leaderboard_is_the_stored_results():
    suite = load_suite("omniglot-v1")
    board = build_leaderboard(suite, read_results(STORED / suite.id, suite.id, True))
    results = (REPO / "docs" / "results.md").read_text()
    block = results.split("<!-- omniglot-v1-leaderboard -->\n", 1)[1]
    assert block.split("<!-- /omniglot-v1-leaderboard -->", 1)[0] == board.markdown("###")


def test_results_page_cross_domain_table_is_the_stored_results():
    # Nearest centroid's accuracy of each model, and below it its paired difference to its
    # random floor, from the stored cross-domain-v1 results (the MAML family's on the first
    # 200 episodes where they have only those, as the page says).
    suite = load_suite("cross-domain-v1")
    stored = read_results(STORED / suite.id, suite.id, True)
    by = {(r.name, r.cell): r for r in stored if r.name.endswith(" + centroid")}
    rows = marked_table((REPO / "docs" / "results.md").read_text(), "cross-domain-table")
    floors = {"conv4": "random conv4 (floor)", "resnet12": "random ResNet-12 (floor)"}
    expected, model = [], None
    for row in rows:
        if not row[0].endswith("− floor"):
            model = row[0]
            count = 200 if "MAML" in model else None
            own = [by[f"{model} + centroid", c.name].accuracies(count) for c in suite.cells]
            expected.append([model, *(f"{100 * float(a.mean()):.2f}" for a in own)])
            continue
        floor = floors["resnet12" if "ResNet-12" in model else "conv4"]
        cells = []
        for cell in suite.cells:
            mine = by[f"{model} + centroid", cell.name].accuracies(count)
            difference = mine - by[f"{floor} + centroid", cell.name].accuracies(len(mine))
            cells.append(f"{100 * float(difference.mean()):+.2f}".replace("-", "−"))
        expected.append([row[0], *cells])
    assert rows == expected


def test_readme_ehg_table_is_the_studys():
    report = json.loads((EHG_SEEDS / "report.json").read_text())
    compared = {(c["group"][0], c["a"], c["b"], c["cell"]): c for c in report["comparisons"]}
    expected = []
    for head, name in EHG_HEADS.items():
        row = [name]
        for shape in ("5w1s", "20w1s"):
            d = compared[f"head={head}", "resplits=1", "resplits=5", shape]
            assert len(d["seeds"]) == 5
            p = d["p_value"]
            row.append(f"{d['difference']:+.2f} ± {d['difference_ci95']:.2f} (p = {p:.2g})")
        expected.append(row)
    assert marked_table(README, "readme-ehg") == expected
    config = json.loads((EHG_SEEDS / "config.json").read_text())
    episodes = config["epochs"] * config["episodes_per_epoch"]
    text = " ".join(README.split())
    assert f"over {len(d['seeds'])} training seeds" in text
    tests = {e["episodes"] for e in report["evaluations"]}
    assert f"{episodes} training episodes, {tests.pop()} seeded test" in text and not tests


def test_readme_quickstart_figure_is_the_measured_one():
    # The quickstart's accuracy as docs/results.md records its measurement.
    (figure,) = re.findall(r"`accuracy: ([\d.]+ ± [\d.]+) %`", README)
    assert f"scripts/quickstart.sh` (4 epochs of 100 60-way episodes) reached **{figure} %**" in (
        " ".join((REPO / "docs" / "results.md").read_text().split())
    )


def readme_sentences() -> list[str]:
    """The README's prose sentences: fenced blocks, tables, headings and comments left out."""
    lines = prose(README).splitlines()
    kept = [line for line in lines if not line.startswith(("|", "#", "<!--"))]
    kept = [f"\n{line}" if line.startswith("- ") else line for line in kept]  # an item: a paragraph
    paragraphs = [" ".join(p.split()) for p in "\n".join(kept).split("\n\n") if p.strip()]
    return [s for p in paragraphs for s in re.split(r"(?<=[.!?])\s+(?=[A-Z`\[(*])", p)]


def test_readme_is_short_and_shows_each_task():
    assert len(README.splitlines()) <= 120
    # No sentence longer than two of the README's lines (100 characters each).
    long = [s for s in readme_sentences() if len(s) > 200]
    assert not long, long
    commands = [c for c in COMMANDS_OF_PAGES if c.page == "README.md"]
    paths = {c.path for c in commands}
    assert paths >= {("train",), ("eval",), ("compare",), ("predict",), ("pretrain",)}
    assert ("hpo", "regularization") in paths
    flags = {t for c in commands for t in c.argv if t.startswith("--")}
    assert flags >= {"--resplits", "--backbone", "--classifier", "--resume"}
    assert [c.launcher for c in commands].count("torchrun") == 1
