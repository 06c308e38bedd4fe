import pytest

from pipelib.checks import check_int


@pytest.mark.parametrize("bad", [0, -3, 1.0, "2", True, None])
def test_check_int_rejects_and_names_the_value(bad):
    with pytest.raises(ValueError, match=rf"steps={bad!r}; pass an integer >= 1"):
        check_int(bad, "steps")


def test_check_int_context_hint_and_minimum():
    assert check_int(0, "recv_ahead", minimum=0) == 0
    with pytest.raises(ValueError, match=r"^gpipe: p=0; pass an integer >= 1 \(pipeline stages\)$"):
        check_int(0, "p", context="gpipe", hint="pipeline stages")
