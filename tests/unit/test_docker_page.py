"""The commands docs/DOCKER.md gives a user to paste are ones the jobs accept: each ``python3 -m <job>`` line
of the page parses with that job's own argument parser (a renamed or dropped option breaks this test, not a
newcomer's run), and the page's pipeline aggregates what the README's demo does. No Spark, no Docker."""

from __future__ import annotations

import importlib
import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def page_commands() -> dict[str, list[str]]:
    """``module -> arguments`` of every ``docker compose exec ... -m module ...`` command of the page."""
    found: dict[str, list[str]] = {}
    for block in re.findall(r"```bash\n(.*?)```", (ROOT / "docs" / "DOCKER.md").read_text(), re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words[:3] == ["docker", "compose", "exec"] and "-m" in words:
                at = words.index("-m")
                found[words[at + 1]] = words[at + 2:]
    return found


def test_the_pages_job_commands_parse() -> None:
    commands = page_commands()
    jobs = {"spark_jobs.pipeline", "spark_jobs.stages.ingest", "spark_jobs.stages.window", "spark_jobs.stages.sink"}
    assert jobs <= set(commands), sorted(commands)
    for job in jobs:
        args = importlib.import_module(job).build_parser().parse_args(commands[job])
        if job != "spark_jobs.pipeline":
            assert args.master == "spark://spark-master:7077" and "spark.cores.max=2" in args.spark_conf, job
            assert args.checkpoint.startswith("/data/") and args.run_id, job


def test_the_pages_pipeline_is_the_readmes_demo() -> None:
    args = " ".join(page_commands()["spark_jobs.pipeline"])
    demo = (ROOT / "Makefile").read_text().split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    for option in ("--key user", "--event-time event_time", "--window 1h", "--sum amount --sum items",
                   "--null-value NA"):
        assert option in args and option in demo, option
