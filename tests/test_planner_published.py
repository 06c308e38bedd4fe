"""The planner against published runs (Narayanan et al. 2021; Dubey et al. 2024): one efficiency
fitted on one row reproduces it, the others are predictions whose error is reported, every
published configuration is feasible and ranked, and the planner sees the published trend."""
from dataclasses import replace

import pytest

from pipelib.planner.published import (
    LLAMA3_405B_STAGED,
    PUBLISHED,
    calibrate,
    comparison,
    predicted,
    utilisation,
)


def test_the_staged_405b_is_the_published_model_with_two_balancing_layers():
    assert round(replace(LLAMA3_405B_STAGED, n_layer=126).num_params() / 1e9) == 406  # "405B"
    assert LLAMA3_405B_STAGED.num_params() / replace(LLAMA3_405B_STAGED, n_layer=126).num_params() < 1.016


def test_calibrated_on_one_row_the_others_are_predictions_with_their_errors():
    eff, rows = comparison()
    assert 0.05 < eff < 1
    first = rows[0]
    assert first["calibration"] and first["predicted"] == pytest.approx(first["published"], abs=1e-6)
    for run, row in zip(PUBLISHED, rows):
        lay = row["plan"].layout
        assert (lay.dp, lay.tp, lay.pp, lay.cp) == run.degrees and run.allows(row["plan"])
        assert row["plan"].feasible and 1 <= row["rank"] <= row["feasible"]
        assert row["error"] == pytest.approx(row["predicted"] / row["published"] - 1)
        assert row["best"].step_time <= row["plan"].step_time  # the search's first is at least as fast
    # the planner sees what Table 4 shows: twice the GPUs on the same batch, half the microbatches
    # a pipeline, a larger bubble share and a lower utilisation
    assert rows[2]["predicted"] < rows[1]["predicted"] and PUBLISHED[2].utilisation < PUBLISHED[1].utilisation
    share = [r["plan"].time["bubble"] / r["plan"].step_time for r in rows]
    assert share[2] > share[1]


def test_hardware_utilisation_counts_the_recomputed_forward():
    run = PUBLISHED[0]
    eff = calibrate(run)
    as_model = predicted(replace(run, counts="model"), eff)
    assert predicted(run, eff) == pytest.approx(run.utilisation, abs=1e-6)
    assert as_model < run.utilisation  # full recomputation: a third more FLOPs than the model's
    with pytest.raises(ValueError, match="counts='peak'"):
        utilisation(None, run.model, run.machine, run.n_devices, "peak")
    with pytest.raises(ValueError, match="outside what efficiency"):
        calibrate(replace(run, utilisation=0.99))
