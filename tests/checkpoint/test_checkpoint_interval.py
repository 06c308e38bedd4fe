"""Young's and Daly's checkpoint intervals against the lost-time model they minimise, and the
crash table the chapter prints."""
import math

import pytest

from pipelib.checkpoint.interval import daly_interval, llama3_mtbf_s, lost_fraction, young_interval


def test_young_minimises_the_first_order_lost_fraction():
    save, mtbf = 30.0, llama3_mtbf_s()
    tau = young_interval(save, mtbf)
    assert tau == pytest.approx(math.sqrt(2 * save * mtbf))
    grid = [tau * f for f in (0.5, 0.8, 0.95, 1.05, 1.25, 2.0)]
    assert all(lost_fraction(tau, save, mtbf) < lost_fraction(t, save, mtbf) for t in grid)


def test_daly_is_shorter_than_young_for_a_small_save_and_m_past_two_m():
    mtbf = llama3_mtbf_s()
    assert 2.7 < mtbf / 3600 < 2.9  # 54 days / 466 interruptions
    assert daly_interval(30, mtbf) < young_interval(30, mtbf)
    assert daly_interval(3 * mtbf, mtbf) == mtbf


def test_a_crash_at_every_step_of_the_save_in_the_chapters_table(tmp_path):
    from pipelib.checkpoint.crashes import CRASH_EXIT, crash_table

    rows = crash_table(str(tmp_path))
    assert len(rows) == 6 and all(r["exit"] == CRASH_EXIT for r in rows)
    assert all(r["latest"] == r["expected"] and r["equal"] for r in rows), rows
