"""A user who stops a replay with Ctrl-C often presses it twice: the second one may come after
the sessions closed, while the results are written, and must not lose them."""

from __future__ import annotations

import os
import signal

import pytest

from notebookos.commands.replay_cmd import _patient_ctrl_c


def test_a_ctrl_c_while_the_results_are_written_waits_and_a_second_one_abandons(
        capsys: pytest.CaptureFixture[str]) -> None:
    before = signal.getsignal(signal.SIGINT)
    try:
        _patient_ctrl_c()
        os.kill(os.getpid(), signal.SIGINT)  # handled at the next bytecode: no exception
        assert "writing what was measured" in capsys.readouterr().err
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)  # os.kill checks for signals on return
    finally:
        signal.signal(signal.SIGINT, before)
