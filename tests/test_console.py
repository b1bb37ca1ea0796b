"""Only the command line prints: library modules log to the ``bertforge`` logger, and `show_logs` makes
that log the console output (INFO as plain lines on stdout, warnings on stderr)."""

from __future__ import annotations

import ast
import logging
import sys
from pathlib import Path

from bertforge.console import show_logs

SRC = Path(__file__).resolve().parents[1] / "src" / "bertforge"


def _print_calls(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"]


def test_no_library_module_prints():
    modules = sorted(SRC.rglob("*.py"))
    assert len(modules) > 30 and SRC / "cli.py" in modules
    found = {str(p.relative_to(SRC)): _print_calls(p) for p in modules if p.name != "cli.py"}
    assert {name: lines for name, lines in found.items() if lines} == {}
    assert _print_calls(SRC / "cli.py")  # the check sees print calls where they are


def test_show_logs_prints_info_on_stdout_and_warnings_on_stderr_once(capsys):
    log = logging.getLogger("bertforge")
    log.info("not shown before show_logs")
    show_logs()
    show_logs()  # a second call adds no second copy of each line
    log.info("pretrain: curves in x.png")
    log.debug("a detail")
    log.warning("precision bf16 is emulated")
    out, err = capsys.readouterr()
    assert out == "pretrain: curves in x.png\n"
    assert err == "WARNING:bertforge:precision bf16 is emulated\n"
    show_logs(verbose=True)
    log.debug("a detail")
    assert capsys.readouterr().out == "a detail\n"


def test_show_logs_writes_to_the_current_stdout(capsys, tmp_path):
    import contextlib

    show_logs()
    with open(tmp_path / "out.txt", "w") as f, contextlib.redirect_stdout(f):
        logging.getLogger("bertforge").info("to the file")
    logging.getLogger("bertforge").info("to the terminal")
    assert (tmp_path / "out.txt").read_text() == "to the file\n"
    assert capsys.readouterr().out == "to the terminal\n"


def test_a_data_command_keeps_its_log_off_stdout(capsys, monkeypatch):
    from bertforge import cli

    def tokenize_and_log(*args, **kwargs):
        logging.getLogger("bertforge").info("loading the tokenizer")
        print('{"tokens": []}')
        return 0

    monkeypatch.setitem(cli.COMMANDS, "tokenize", tokenize_and_log)
    monkeypatch.setattr(cli, "_run", lambda command, args: cli.COMMANDS[command]())
    assert cli.main(["tokenize"]) == 0
    out, err = capsys.readouterr()
    assert out == '{"tokens": []}\n' and err == "loading the tokenizer\n"
    monkeypatch.setitem(cli.COMMANDS, "pretrain", tokenize_and_log)
    assert cli.main(["pretrain"]) == 0  # a training command: its log is its output
    assert capsys.readouterr().out == 'loading the tokenizer\n{"tokens": []}\n'


def test_a_progress_bar_off_a_terminal_writes_whole_lines_at_intervals(monkeypatch):
    import io
    import time

    from bertforge import console

    err = io.StringIO()  # a log file: no terminal
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(console, "LINE_INTERVAL", 0.05)
    bar = console.progress_bar(total=20, desc="train", unit="step")
    for i in range(20):
        time.sleep(0.01)
        bar.update(1)
    bar.close()
    text = err.getvalue()
    lines = text.splitlines()
    assert "\r" not in text and lines[-1].startswith("train: 100%") and "20/20" in lines[-1]
    assert 2 <= len(lines) < 20  # at intervals, not a line a step
    assert all(line.startswith("train:") and len(line) <= 100 for line in lines)


def test_a_progress_bar_on_a_terminal_redraws_in_place(monkeypatch):
    import io

    from bertforge import console

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    err = Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    bar = console.progress_bar(total=3, desc="train", mininterval=0)
    for _ in range(3):
        bar.update(1)
    bar.close()
    assert "\r" in err.getvalue()
