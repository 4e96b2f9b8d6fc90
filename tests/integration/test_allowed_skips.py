"""The allowed-skips plugin of `make test` (tests/pytest_allowed_skips.py).

A throw-away test file that skips is run by a child pytest with the plugin: a skip
that tests/allowed-skips.txt does not allow fails the run (exit 1) and is listed
with its reason; the same skip allowed by a rule (the plugin told to read another
rules file) passes; a malformed rules file is an error, not a silently empty list.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

SKIPPING = textwrap.dedent('''
    import pytest

    def test_runs():
        assert True

    def test_skips():
        pytest.skip("no frobnicator on this machine")
''')


def run_child(tmp_path, rules=None):
    (tmp_path / "test_child.py").write_text(SKIPPING)
    env = dict(os.environ, PYTHONPATH=str(TESTS))
    args = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
            "-p", "pytest_allowed_skips", str(tmp_path / "test_child.py")]
    if rules is not None:
        path = tmp_path / "rules.txt"
        path.write_text(rules)
        # the plugin's module-level RULES_FILE, pointed elsewhere before pytest loads it
        args[1:1] = ["-c", "import pytest_allowed_skips as p, sys, pytest; "
                     f"p.RULES_FILE = {str(path)!r}; "
                     "sys.exit(pytest.main(sys.argv[1:]))"]
        args.remove("-m")
        args.remove("pytest")
    return subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)


def test_an_unexpected_skip_fails_the_run(tmp_path):
    cp = run_child(tmp_path)
    out = cp.stdout + cp.stderr
    assert cp.returncode == 1, out
    assert "unexpected skips" in out and "no frobnicator on this machine" in out, out
    assert "1 passed, 1 skipped" in out, out


def test_an_allowed_skip_passes(tmp_path):
    cp = run_child(tmp_path, rules="# a comment\ntest_child.py::test_skips  frobnicator\n")
    out = cp.stdout + cp.stderr
    assert cp.returncode == 0, out
    assert "unexpected skips" not in out, out


def test_a_rule_for_another_reason_does_not_allow_it(tmp_path):
    cp = run_child(tmp_path, rules="test_child.py::test_skips  no GPU\n")
    assert cp.returncode == 1, cp.stdout + cp.stderr


def test_a_malformed_rules_file_is_an_error(tmp_path):
    cp = run_child(tmp_path, rules="test_child.py::test_skips\n")
    out = cp.stdout + cp.stderr
    assert cp.returncode != 0 and "want 'TEST-ID-PATTERN REASON-REGEX'" in out, out
