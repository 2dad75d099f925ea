import datetime as dt
from pathlib import Path

import pytest

from fx_assets.settings import load_settings


def test_defaults() -> None:
    s = load_settings({})
    assert s.data_root == Path("data")
    assert s.symbols == ("ES.FUT",)
    assert s.first_quarter == dt.date(2024, 1, 1)
    assert s.last_quarter is None


def test_environment() -> None:
    s = load_settings(
        {
            "FX_DATA_ROOT": "/x",
            "FX_SYMBOLS": "ES.FUT, NQ.FUT",
            "FX_FIRST_QUARTER": "2023-Q3",
            "FX_LAST_QUARTER": "2024-Q2",
        }
    )
    assert s.data_root == Path("/x")
    assert s.symbols == ("ES.FUT", "NQ.FUT")
    assert s.first_quarter_label == "2023-Q3"
    assert s.last_quarter_label == "2024-Q2"


def test_toml_file_and_env_override(tmp_path: Path) -> None:
    cfg = tmp_path / "fx.toml"
    cfg.write_text('[project]\ndata_root = "store"\nsymbols = ["CL.FUT"]\nfirst_quarter = "2022-Q4"\n')
    s = load_settings({"FX_CONFIG": str(cfg)})
    assert s.data_root == tmp_path / "store"
    assert s.symbols == ("CL.FUT",)
    assert s.first_quarter_label == "2022-Q4"
    s2 = load_settings({"FX_CONFIG": str(cfg), "FX_SYMBOLS": "ES.FUT"})
    assert s2.symbols == ("ES.FUT",)


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"FX_SYMBOLS": "ES|FUT"}, "not a valid partition key"),
        ({"FX_FIRST_QUARTER": "2024-Q9"}, "not a quarter"),
        ({"FX_FIRST_QUARTER": "2024-Q3", "FX_LAST_QUARTER": "2024-Q1"}, "before first quarter"),
        ({"FX_CONFIG": "/nonexistent/fx.toml"}, "does not exist"),
    ],
)
def test_bad_settings(env: dict[str, str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        load_settings(env)


def test_unknown_toml_key(tmp_path: Path) -> None:
    cfg = tmp_path / "fx.toml"
    cfg.write_text('[project]\ndata_rot = "x"\n')
    with pytest.raises(ValueError, match="unknown keys"):
        load_settings({"FX_CONFIG": str(cfg)})
