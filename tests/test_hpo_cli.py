"""`fewshot hpo ...` end to end through `fewshot.cli.main`: outputs, --help, one-line refusals."""

from __future__ import annotations

import gzip
import json
import time

import pytest
from cli_errors import error_line

from fewshot.cli.main import main
from fewshot.hpo.cli import COMMANDS
from fewshot.hpo.splits import MAX_RESPLITS


def test_regularization_prints_and_writes_the_same_numbers(tmp_path, capsys):
    args = ["hpo", "regularization", "--dataset", "heart", "--model", "svm", "--method", "oehg"]
    args += ["--seed", "1", "--out", str(tmp_path), "--outer-steps", "40", "--resplits", "3"]
    assert main(args) == 0
    out = capsys.readouterr().out
    saved = json.loads((tmp_path / "heart_svm_oehg_seed1.json").read_text())
    assert f"test loss: {saved['test_loss']:.4f}" in out
    assert f"test accuracy: {saved['test_accuracy']:.2f} %" in out
    assert saved["settings"]["resplits"] == 3 and len(saved["curve"]) == 40
    assert (tmp_path / "heart_svm_oehg_seed1.png").stat().st_size > 0


def test_regression_prints_no_accuracy(tmp_path, capsys):
    args = ["hpo", "regularization", "--dataset", "pyrim", "--model", "lasso", "--method"]
    args += ["aid-cg", "--per-parameter", "--out", str(tmp_path), "--outer-steps", "3"]
    assert main([*args, "--inner-steps", "8"]) == 0
    out = capsys.readouterr().out
    assert "test loss:" in out and "accuracy" not in out
    saved = json.loads((tmp_path / "pyrim_lasso_aid-cg_pp_seed0.json").read_text())
    assert len(saved["lam"]) == 27


def test_bias_variance_prints_table_and_saves_plot(tmp_path, capsys):
    args = ["hpo", "bias-variance", "--resplits", "1", "4", "--repeats", "30"]
    args += ["--out", str(tmp_path)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "var x U" in out and "bias^2" in out
    rows = json.loads((tmp_path / "bias_variance.json").read_text())["rows"]
    assert {r["splits"] for r in rows} == {1, 4}
    assert (tmp_path / "bias_variance.png").stat().st_size > 0


@pytest.mark.parametrize("command", [c.path[1] for c in COMMANDS])
def test_help_works_for_every_command(capsys, command):
    with pytest.raises(SystemExit) as exit_info:
        main(["hpo", command, "--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--seed" in text and "(default: 0)" in text


REG = "hpo regularization --dataset heart --model logistic --method {method} --out {tmp}"
CLEAN = "hpo cleaning --dataset mnist --model sr --method {method} --out {tmp} --data-root {tmp}"
IMAGE = "hpo image-regularization --dataset mnist --model sr --method {method} --out {tmp}"
BV = "hpo bias-variance --out {tmp}"
# (command, extra words, text the one error line must contain)
REFUSED = [
    (REG.format(method="oehg", tmp="{tmp}"), "--seed -1", "--seed must be >= 0"),
    (REG.format(method="oehg", tmp="{tmp}"), f"--seed {2**63}", "--seed must be >= 0 and <="),
    (REG.format(method="trhg", tmp="{tmp}"), "--truncate -3", "--truncate must be >= 1"),
    (REG.format(method="rhg", tmp="{tmp}"), "--outer-lr nan", "--outer-lr must be a finite"),
    (REG.format(method="rhg", tmp="{tmp}"), "--init-lam inf", "--init-lam must be a finite"),
    (REG.format(method="rhg", tmp="{tmp}"), "--init-lam 0", "--init-lam must be > 0"),
    (REG.format(method="rhg", tmp="{tmp}"), "--gamma 1.5", "--gamma must be > 0 and < 1"),
    (REG.format(method="rhg", tmp="{tmp}"), "--outer-steps 0", "--outer-steps must be >= 1"),
    (REG.format(method="rhg", tmp="{tmp}"), "--inner-lr -1", "--inner-lr must be > 0"),
    (
        REG.format(method="trhg", tmp="{tmp}"),
        "--truncate 5 --inner-steps 4",
        "--truncate must be <=",
    ),
    (
        REG.format(method="trhg", tmp="{tmp}"),
        "--inner-steps 4",
        "--truncate must be <= inner_steps (4), got 32 (its default",
    ),
    (
        REG.format(method="oehg", tmp="{tmp}"),
        "--resplits 1000000000",
        f"--resplits must be <= {MAX_RESPLITS}",
    ),
    (REG.format(method="aid-cg", tmp="{tmp}").replace("logistic", "svm"), "", "--method aid-cg"),
    (REG.format(method="rhg", tmp="{tmp}").replace("logistic", "ridge"), "", "--model ridge"),
    (CLEAN.format(method="oehg", tmp="{tmp}"), "--seed -1", "--seed must be >= 0"),
    (CLEAN.format(method="oehg", tmp="{tmp}"), "--noise 1.0", "--noise must be >= 0 and < 1"),
    (
        CLEAN.format(method="rhg", tmp="{tmp}"),
        "--resplits 3",
        "--resplits does not apply to --method rhg (got 3; leave it at 1 or None)",
    ),
    (
        CLEAN.format(method="trhg", tmp="{tmp}"),
        "--inner-steps 2",
        "--truncate must be <= inner_steps (2)",
    ),
    (
        CLEAN.format(method="oehg", tmp="{tmp}"),
        "--resplits 30",
        "--resplits 30 needs 29 x extra_val (400)",
    ),
    (CLEAN.format(method="oehg", tmp="{tmp}"), "--threshold nan", "--threshold must be a finite"),
    (IMAGE.format(method="oehg", tmp="{tmp}"), "--resplits 0", "--resplits must be >= 1"),
    (IMAGE.format(method="oehg", tmp="{tmp}"), "--outer-lr inf", "--outer-lr must be a finite"),
    (IMAGE.format(method="trhg", tmp="{tmp}"), "--truncate 200", "--truncate must be <= inner"),
    (BV, "--resplits 1 x", "argument --resplits: invalid int value: 'x'"),
    (BV, "--resplits 0 2", "--resplits values must lie in 1..231"),
    (BV, "--resplits 232", "--resplits values must lie in 1..231"),
    (BV, "--repeats 0", "--repeats must be >= 1"),
    (BV, "--seed -5", "--seed must be >= 0"),
    # 7 MiB a step: 10^9 steps cannot fit on any machine; refused before the first step.
    (BV, "--inner-steps 1000000000", "needs about 6884336.5 GiB (1000000000 kept RHG steps"),
]


@pytest.mark.parametrize(("command", "extra", "message"), REFUSED, ids=[r[2] for r in REFUSED])
def test_bad_settings_are_one_line_naming_the_flag(capsys, tmp_path, command, extra, message):
    words = [w.replace("{tmp}", str(tmp_path)) for w in (command + " " + extra).split()]
    start = time.perf_counter()
    assert message in error_line(capsys, words)
    assert time.perf_counter() - start < 5  # refused before any data is read or step is run
    assert not any(tmp_path.glob("*.json"))


def test_rhg_cleaning_does_not_check_the_truncation_it_does_not_use(capsys, tmp_path):
    # --inner-steps 2 is below the default --truncate 16, which only T-RHG reads: the run goes on
    # to read the data (absent from this empty data root) instead of refusing --truncate.
    words = [*CLEAN.format(method="rhg", tmp=tmp_path).split(), "--inner-steps", "2"]
    err = error_line(capsys, words)
    assert "missing IDX file" in err and "truncate" not in err


def test_impossible_split_count_is_refused_at_once(capsys, tmp_path):
    # pyrim's 14 observed examples with 3 for validation have C(14, 3) = 364 distinct splits.
    words = REG.format(method="oehg", tmp=tmp_path).replace("heart", "pyrim").split()
    words = [w.replace("logistic", "ridge") for w in words] + ["--resplits", "365"]
    start = time.perf_counter()
    assert "allow only 364 distinct splits" in error_line(capsys, words)
    assert time.perf_counter() - start < 5


def test_every_distinct_split_can_be_used(capsys, tmp_path):
    words = REG.format(method="oehg", tmp=tmp_path).replace("heart", "pyrim").split()
    words = [w.replace("logistic", "ridge") for w in words]
    assert main([*words, "--resplits", "364", "--outer-steps", "2"]) == 0
    saved = json.loads((tmp_path / "pyrim_ridge_oehg_seed0.json").read_text())
    assert saved["settings"]["resplits"] == 364


def test_corrupt_libsvm_files_are_one_line_naming_the_file(capsys, tmp_path):
    folder = tmp_path / "libsvm" / "classification"
    folder.mkdir(parents=True)
    words = REG.format(method="rhg", tmp=tmp_path).replace("heart", "a9a").split()
    words += ["--data-root", str(tmp_path)]
    (folder / "a9a.t").write_text("+1 1:1\n-1 2:1\n")
    lines = "".join(f"{(-1) ** i:+d} 1:{i / 7:.6f} 2:{i % 13}\n" for i in range(400))
    packed = gzip.compress(lines.encode())
    (folder / "a9a.gz").write_bytes(packed[: len(packed) // 2])
    assert "a9a.gz: truncated file" in error_line(capsys, words)
    (folder / "a9a.gz").unlink()
    (folder / "a9a").write_text("+1 1:0.5\n-1 1:0.25 2:oops\n")
    err = error_line(capsys, words)
    assert "a9a:2:" in err and "'2:oops'" in err


def pyrim(tmp_path, *extra: str) -> list[str]:
    """A fast regularization run writing into tmp_path/out."""
    args = ["hpo", "regularization", "--dataset", "pyrim", "--model", "ridge", "--method", "rhg"]
    return [
        *args,
        "--outer-steps",
        "2",
        "--inner-steps",
        "4",
        "--out",
        str(tmp_path / "out"),
        *extra,
    ]


def test_a_result_of_other_settings_is_kept_unless_overwrite(tmp_path, capsys):
    assert main(pyrim(tmp_path, "--outer-lr", "0.01")) == 0
    result = tmp_path / "out" / "pyrim_ridge_rhg_seed0.json"
    # The same settings again: the same result, replaced without a word.
    assert main(pyrim(tmp_path, "--outer-lr", "0.01")) == 0
    capsys.readouterr()
    kept = result.read_bytes()
    err = error_line(capsys, pyrim(tmp_path, "--outer-lr", "0.02"))
    differ = "outer_lr: 0.01 there, 0.02 here"
    refusal = f"{result} already holds another result ({differ}); pass --overwrite to replace it"
    assert err.endswith(f": {refusal}")
    assert result.read_bytes() == kept
    assert main(pyrim(tmp_path, "--outer-lr", "0.02", "--overwrite")) == 0
    assert json.loads(result.read_text())["settings"]["outer_lr"] == 0.02


def test_an_unwritable_out_is_refused_before_the_work(tmp_path, capsys, monkeypatch):
    import fewshot.hpo.tasks.regularization as task

    monkeypatch.setattr(task, "load", lambda s: pytest.fail("the data was read"))
    blocker = tmp_path / "file"
    blocker.write_text("")
    args = [*pyrim(tmp_path)[:-1], str(blocker / "under")]
    assert error_line(capsys, args).endswith(
        f": --out {blocker / 'under'} lies under {blocker}, which is a file: it must name a folder"
    )
    # A folder where the result file goes is not replaced either.
    (tmp_path / "out" / "pyrim_ridge_rhg_seed0.json").mkdir(parents=True)
    assert "it is a folder" in error_line(capsys, pyrim(tmp_path))


@pytest.mark.parametrize("template", [REG, CLEAN, IMAGE, BV], ids=lambda t: t.split()[1])
def test_an_out_that_is_a_file_is_refused_naming_it_before_the_work(capsys, tmp_path, template):
    out = tmp_path / "F"
    out.write_text("kept")
    words = template.format(method="rhg", tmp=tmp_path).split()
    words[words.index("--out") + 1] = str(out)
    start = time.perf_counter()
    assert error_line(capsys, words) == (
        f"fewshot {' '.join(words[:2])}: error: --out {out} is a file: it must name a folder"
    )
    assert time.perf_counter() - start < 5  # before any data is read or step is run
    assert out.read_text() == "kept"


def test_the_plot_of_a_kept_result_is_kept(tmp_path, capsys):
    plot = tmp_path / "out" / "bias_variance.png"
    plot.parent.mkdir()
    plot.write_bytes(b"an earlier plot")
    args = ["hpo", "bias-variance", "--resplits", "1", "--repeats", "2", "--out", str(plot.parent)]
    assert "already holds another result" in error_line(capsys, args)
    assert plot.read_bytes() == b"an earlier plot"
