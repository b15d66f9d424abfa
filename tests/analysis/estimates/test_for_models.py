"""StudyData.for_models: the frames narrowed to what the suite reads give the same tables as the
full frames (the truth here is the suite fitted on the frames as the read side returns them)."""

import numpy as np
import pandas as pd

from analysis.estimates import StudyData
from analysis.fits import suite_tables
from analysis.report import fit_models
from analysis.simulation.synthetic import synthetic_study


def test_narrowed_frames_give_the_same_tables() -> None:
    study = synthetic_study(400, seed=3)
    full = StudyData(panel=study.panel(), conversations=study.conversation_features(), survival=study.survival(),
                     study="synthetic", read_at=study.read_at)
    narrow = full.for_models()
    assert len(narrow.panel.columns) < len(full.panel.columns)
    assert narrow.panel.memory_usage(deep=False).sum() < full.panel.memory_usage(deep=False).sum()
    expected = suite_tables(fit_models(full, n_boot=20, seed=2, checks=False))
    found = suite_tables(fit_models(narrow, n_boot=20, seed=2, checks=False))
    assert expected.keys() == found.keys()
    for name, table in expected.items():
        other = found[name]
        assert list(table.columns) == list(other.columns), name
        assert len(table) == len(other), name
        for column in table.columns:
            a, b = table[column], other[column]
            if pd.api.types.is_numeric_dtype(a) and not pd.api.types.is_bool_dtype(a):
                np.testing.assert_allclose(a.to_numpy(float), b.to_numpy(float), rtol=1e-9, atol=1e-12,
                                           err_msg=f"{name}.{column}")
            else:
                assert a.astype(str).tolist() == b.astype(str).tolist(), f"{name}.{column}"


def test_coded_strings_are_shared_and_missing_values_kept() -> None:
    codes = pd.Series(["a" + str(i % 2) for i in range(6)] + [None], dtype=object)
    panel = pd.DataFrame({"participant_code": [f"p{i}" for i in range(7)], "wave": codes, "regret": np.arange(7),
                          "timezone": ["Europe/Paris"] * 7})
    narrow = StudyData(panel=panel).for_models().panel
    assert list(narrow.columns) == ["participant_code", "wave", "regret"]
    assert narrow["wave"].dtype == object
    assert narrow["wave"].tolist()[:6] == codes.tolist()[:6]
    assert narrow["wave"].iloc[6] is None
    assert narrow["wave"].iloc[0] is narrow["wave"].iloc[2]  # one string object per distinct value
    assert narrow["regret"].dtype == np.int32
    assert narrow["regret"].tolist() == list(range(7))
