"""--inner-steps (fewshot eval, compare, predict): the MAML family's gradient steps on each test
episode's support, checked against the checkpoint rewritten to take that many steps itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cli_errors import error_line
from test_predict import write_folders

import fewshot
from fewshot.cli.main import main

MODELS = Path(__file__).resolve().parents[1] / "models" / "omniglot"
ANIL = MODELS / "anil_conv4_5way1shot_cpu.pt"
PROTONET = MODELS / "protonet_conv4_1shot.pt"
EPISODES = ["--way", "5", "--shot", "5", "--episodes", "12", "--seed", "3", "--device", "cpu"]


def taking(steps: int, out: Path) -> Path:
    """The shipped ANIL checkpoint with `steps` test-time steps in its own settings."""
    checkpoint = torch.load(ANIL, weights_only=True, map_location="cpu")
    checkpoint["config"]["method_options"]["eval_inner_steps"] = steps
    torch.save(checkpoint, out)
    return out


def evaluated(tmp_path: Path, name: str, *args: str) -> dict:
    """The JSON record of `fewshot eval` with the test episodes and `args`."""
    out = tmp_path / f"{name}.json"
    assert main(["eval", *EPISODES, "--per-episode", "--out", str(out), *args]) == 0
    return json.loads(out.read_text())


def test_eval_takes_the_steps_the_checkpoint_would_and_records_them(tmp_path, capsys):
    flagged = evaluated(tmp_path, "flag", "--checkpoint", str(ANIL), "--inner-steps", "3")
    reference = evaluated(tmp_path, "ref", "--checkpoint", str(taking(3, tmp_path / "a.pt")))
    default = evaluated(tmp_path, "default", "--checkpoint", str(ANIL))
    assert flagged["accuracies"] == reference["accuracies"]
    assert default["method_options"]["eval_inner_steps"] == 20  # chosen on validation
    assert flagged["accuracies"] != default["accuracies"]
    assert flagged["inner_steps"] == 3 and "inner_steps" not in default
    # Another number of steps is another result: kept at its path unless --overwrite.
    again = ["eval", *EPISODES, "--checkpoint", str(ANIL), "--out", str(tmp_path / "flag.json")]
    assert main([*again, "--per-episode", "--inner-steps", "3"]) == 0
    assert main([*again, "--per-episode", "--inner-steps", "1"]) == 2


def test_compare_and_predict_take_them_too(tmp_path, omniglot_test):
    steps = str(taking(0, tmp_path / "zero.pt"))
    out = tmp_path / "compare.json"
    argv = ["compare", str(ANIL), steps, *EPISODES, "--inner-steps", "0", "--out", str(out)]
    assert main(argv) == 0
    record = json.loads(out.read_text())
    assert record["inner_steps"] == 0 and record["difference"]["mean"] == 0.0
    support, query = write_folders(tmp_path, omniglot_test, [0, 40, 80, 120, 160], 2, 2)
    flagged = fewshot.predict(ANIL, support, query, inner_steps=7, device="cpu")
    reference = fewshot.predict(taking(7, tmp_path / "b.pt"), support, query, device="cpu")
    default = fewshot.predict(ANIL, support, query, device="cpu")
    assert torch.equal(flagged.scores, reference.scores)
    assert not torch.equal(flagged.scores, default.scores)


@pytest.mark.parametrize(
    "args, line",
    [
        (["--checkpoint", str(PROTONET), "--inner-steps", "5"], "does not apply to --method"),
        (["--checkpoint", str(ANIL), "--inner-steps", "-1"], "--inner-steps"),
    ],
)
def test_eval_refuses_steps_it_cannot_take(tmp_path, capsys, args, line):
    err = error_line(capsys, ["eval", *EPISODES, "--out", str(tmp_path / "r.json"), *args])
    assert line in err and "--inner-steps" in err
