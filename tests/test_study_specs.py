"""The studies written as sweep specs (experiments/*/spec*.yaml): each regenerates its recorded
report, byte for byte, from its recorded evaluations alone, training nothing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from fewshot.cli.main import main

REPO = Path(__file__).resolve().parents[1]
SPECS = sorted(REPO.glob("experiments/*/spec*.yaml"))
# A recorded study: a spec whose sweep folder, in experiments/, holds its report.
RECORDED = [
    spec
    for spec in SPECS
    if (out := Path(yaml.safe_load(spec.read_text())["out"])).parts[0] == "experiments"
    and (REPO / out / "report.md").is_file()
]


def configs(values: object) -> set[str]:
    """Every config file a spec names: its own and its named variants'."""
    if isinstance(values, dict):
        named = {values["config"]} if isinstance(values.get("config"), str) else set()
        return named.union(*map(configs, values.values()))
    if isinstance(values, list):
        return set().union(*map(configs, values))
    return set()


def test_the_studies_are_specs_with_recorded_reports():
    assert len(RECORDED) >= 5, [spec.name for spec in RECORDED]


@pytest.mark.parametrize("spec", RECORDED, ids=lambda spec: spec.parent.name + "/" + spec.name)
def test_a_study_regenerates_its_report_from_its_recorded_evaluations(
    spec, tmp_path, monkeypatch, capsys
):
    values = yaml.safe_load(spec.read_text())
    out = Path(values["out"])
    recorded = {name: (REPO / out / name).read_text() for name in ("report.md", "report.json")}
    # The study's evaluations, spec and config where the sweep looks for them; no run folder.
    shutil.copytree(REPO / out, tmp_path / out, ignore=shutil.ignore_patterns("report.*"))
    for path in (spec.relative_to(REPO), *map(Path, configs(values))):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / path, tmp_path / path)
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", str(spec.relative_to(REPO)), "--plan"]) == 0
    plan = capsys.readouterr().out
    assert "to run" not in plan and "to resume" not in plan, plan
    assert main(["sweep", str(spec.relative_to(REPO))]) == 0
    assert "running" not in capsys.readouterr().out  # no job ran: every evaluation was there
    for name, text in recorded.items():
        assert (tmp_path / out / name).read_text() == text, name
    runs = Path(values.get("runs") or out / "runs")
    assert not (tmp_path / runs).exists()
