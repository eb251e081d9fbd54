"""Shared test settings and the forked CLI server (imported by the CLI-driven tests)."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

# A tiny CartPole run (`--set KEY=VALUE` strings): about a second of training after imports.
TINY_CARTPOLE = {
    "hidden_sizes": "[32,32]",
    "learning_starts": 200,
    "batch_size": 32,
    "gradient_accumulation_steps": 1,
    "buffer_capacity": 5000,
    "train_freq": 4,
    "gradient_steps": 1,
    "target_update_interval": 50,
    "log_interval": 100,
}


# Forks one child per request; an uncaught exception prints a traceback and exits 1, like Python.
SERVER = r"""
import json, os, sys, traceback
import foxhunt.cli, foxhunt.runs, foxhunt.session, foxhunt.report, foxhunt.checkpoint
import foxhunt.markets.data, foxhunt.logging, rich.style
for line in sys.stdin:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.chdir(req["cwd"])
            for fd, name in ((1, "stdout"), (2, "stderr")):
                os.dup2(os.open(req[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
            sys.argv = ["foxhunt", *req["argv"]]
            code = foxhunt.cli.main(req["argv"])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if not isinstance(exc.code, int | None):
                print(exc.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    print(json.dumps(os.waitstatus_to_exitcode(status)), flush=True)
"""


def cli_env() -> dict[str, str]:
    path = os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path}


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str


class ForkedCli:
    """Runs ``foxhunt.cli.main(argv)`` in forked children of one pre-imported server."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self.n = 0
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=cli_env(),
            text=True,
        )

    def __call__(self, *argv: str, cwd: Path, timeout: float = 120.0) -> Result:
        self.n += 1
        out, err = self.scratch / f"{self.n}.out", self.scratch / f"{self.n}.err"
        req = {"argv": list(argv), "cwd": str(cwd), "stdout": str(out), "stderr": str(err)}
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            self.proc.kill()
            pytest.fail(f"foxhunt {' '.join(argv)} did not finish within {timeout} s")
        code = json.loads(self.proc.stdout.readline())
        return Result(code, out.read_text(), err.read_text())

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)
