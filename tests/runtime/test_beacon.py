"""The activity beacon alone: what a rank is doing, written to a file another process can read."""
import time

from pipelib.runtime.beacon import Activity


def test_without_a_file_it_only_remembers_the_text():
    a = Activity()
    assert a.text == "idle" and a.map is None
    with a.doing("outer"):
        with a.doing("inner"):
            assert a.text == "inner"
        assert a.text == "outer"
    assert a.text == "idle"


def test_the_file_says_the_text_and_its_age_and_restores_after_an_error(tmp_path):
    path = str(tmp_path / "beacon")
    a = Activity(path)
    assert Activity.read(path)[1] == "idle"
    try:
        with a.doing("recv from rank 3"):
            time.sleep(0.05)
            age, text = Activity.read(path)
            assert text == "recv from rank 3" and 0.04 <= age < 5
            raise KeyError("boom")
    except KeyError:
        pass
    assert Activity.read(path)[1] == "idle"


def test_a_long_text_is_cut_to_the_file_and_a_missing_file_reads_unknown(tmp_path):
    path = str(tmp_path / "beacon")
    Activity(path).set("x" * 2000)
    assert Activity.read(path)[1] == "x" * (Activity.SIZE - 8)
    Activity(path).set("é" * 10)  # a short text after a long one leaves no tail behind
    assert Activity.read(path)[1] == "é" * 10
    assert Activity.read(str(tmp_path / "absent")) == (None, "unknown")
