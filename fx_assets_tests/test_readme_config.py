"""Every run-config example in README.md is accepted by the project's jobs, as a user pastes it
into the launchpad; partial training config keeps the project's fold window."""

import datetime as dt
import re
from pathlib import Path

import dagster as dg
import pytest
import yaml

from fx_assets.definitions import build_definitions
from fx_assets.resources.training import TrainingConfig
from fx_assets.settings import ProjectSettings

README = Path(__file__).resolve().parents[1] / "README.md"


def yaml_examples() -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_run_config_examples() -> None:
    assert len(yaml_examples()) >= 1


@pytest.mark.parametrize("example", yaml_examples())
def test_readme_run_config_example_is_valid(example: str, tmp_path: Path) -> None:
    config = yaml.safe_load(example)
    defs = build_definitions(
        ProjectSettings(
            data_root=tmp_path, first_quarter=dt.date(2024, 1, 1), last_quarter=dt.date(2024, 10, 1)
        )
    )
    used = set()
    for name in ("build_features", "train_models", "walk_forward", "signal_reports"):
        resolved = dg.validate_run_config(defs.resolve_job_def(name), config)["resources"]
        for res, body in config.get("resources", {}).items():
            if res not in resolved:  # the job's assets do not use this resource
                continue
            used.add(res)
            # What the example sets is what the run gets (nested, partial dicts).
            for section, fields in body["config"].items():
                got = resolved[res]["config"][section]
                assert {k: got[k] for k in fields} == fields, (name, res, section)
    assert used == set(config.get("resources", {})), "a resource no job uses"


def test_partial_training_config_keeps_the_project_window() -> None:
    t = TrainingConfig.model_validate({"train": {"trainer": "dqn", "epochs": 10}})
    assert t.train_config().trainer == "dqn" and t.train_config().epochs == 10
    assert t.fold_config(3).train_quarters == 3
    with pytest.raises(dg.Failure, match="train_quarters=2 differs"):
        TrainingConfig.model_validate({"folds": {"train_quarters": 2}}).fold_config(3)
