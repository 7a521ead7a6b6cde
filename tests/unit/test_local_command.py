"""``controlmsg local PART ACTION``: one verb family for the local clusters, each part's own command line
behind it (``kafka`` is ``controlmsg broker``). Starting the parts is tested where they are used
(tests/spark/test_cluster_storage.py, tests/integration/test_fresh_broker.py); here, that every part is
reached and says when nothing runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from controlmsg.cli import main


@pytest.mark.parametrize(("part", "action", "option", "said"), [
    ("kafka", "status", "--data-dir", "no broker running"),
    ("hdfs", "status", "--dir", "no local HDFS runs from"),
    ("s3", "status", "--dir", "no local S3 endpoint runs from"),
    ("spark", "stop", "--dir", "no cluster recorded in"),
])
def test_each_part_answers_that_nothing_runs(part: str, action: str, option: str, said: str, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["local", part, action, option, str(tmp_path / "none")]) == 1
    captured = capsys.readouterr()
    assert said in captured.err + captured.out


def test_a_parts_own_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["local", "hdfs", "--help"])
    assert done.value.code == 0
    assert "{start,stop,status,fetch,write-lock}" in capsys.readouterr().out
