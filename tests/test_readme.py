"""README's Python examples run as written (the training budget shrunk to keep the suite fast)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_examples_run(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)  # the examples write a run directory
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) >= 2
    code = "\n".join(blocks).replace("trainer.learn(50_000)", "trainer.learn(1_000)")
    code = code.replace("total_steps=60_000", "total_steps=1_500")
    # The examples this test shrinks are still there.
    assert "trainer.learn(1_000)" in code and "total_steps=1_500" in code
    namespace: dict[str, object] = {}
    exec(compile(code, str(README), "exec"), namespace)
    assert namespace["action"] in (0, 1) and (tmp_path / "runs/cartpole-py/model.json").is_file()
    stats = namespace["stats"]
    assert stats.pre_clip_norm > 0 and stats.lr > 0  # type: ignore[attr-defined]
    # The trading example: a run directory the CLI can use, and a backtest of its test span.
    assert namespace["summary"]["env_steps"] == 1_500  # type: ignore[index]
    assert (tmp_path / "runs/long-only/backtest/report.html").is_file()
    assert namespace["backtest"]["split"] == "test"  # type: ignore[index]
    assert set(namespace["agent"]) >= {"sharpe", "total_log_return"}  # type: ignore[arg-type]
    assert "agent_equity" in namespace["series"].columns  # type: ignore[attr-defined]
    assert namespace["decision"]["position"] in (0.0, 1.0)  # type: ignore[index]  # long-only
