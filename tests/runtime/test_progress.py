"""Start-up progress: shown in a notebook, silent in tests and scripts unless asked."""
from pipelib.runtime.progress import StartupProgress, in_notebook


def test_silent_outside_a_notebook(capsys):
    assert not in_notebook()
    StartupProgress().say("starting")
    assert capsys.readouterr().out == ""


def test_each_phase_one_line_with_the_seconds_so_far(capsys):
    p = StartupProgress(on=True)
    p.say("starting 4 engines")
    p.say("ready")
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[0].endswith("s] starting 4 engines") and lines[0].startswith("[")
