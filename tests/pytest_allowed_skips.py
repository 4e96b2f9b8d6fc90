"""A pytest plugin: a skip that tests/allowed-skips.txt does not name fails the run.

`make test` runs every pytest pass with `-p pytest_allowed_skips -rs` (tests/ on
PYTHONPATH), so each skip prints its reason and a skip nobody expected — a
missing tool, a package that did not install, a fixture that gave up — turns the
pass red instead of hiding coverage behind a green line.

tests/allowed-skips.txt holds one rule a line: a test id pattern (fnmatch, as
pytest prints node ids: ``tests/integration/test_gpu_load.py::*``), whitespace,
and a regular expression that the skip's reason must match (re.search); ``#``
starts a comment.  A skip matching no rule is listed at the end of the run with
its reason and the exit status becomes 1 (pytest's "tests failed").
"""

import fnmatch
import os
import re

RULES_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "allowed-skips.txt")


def load_rules(path=None):
    """[(id pattern, compiled reason regex)] from @path (default RULES_FILE); a malformed
    line raises ValueError."""
    path = path or RULES_FILE
    rules = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split(None, 1)
            if len(parts) != 2:
                raise ValueError(f"{path}:{n}: want 'TEST-ID-PATTERN REASON-REGEX', got {line!r}")
            rules.append((parts[0], re.compile(parts[1])))
    return rules


def skip_reason(report):
    """The reason pytest recorded for a skipped @report."""
    lr = report.longrepr
    if isinstance(lr, tuple) and len(lr) == 3:
        reason = lr[2]
    else:
        reason = str(lr)
    return reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason


def allowed(nodeid, reason, rules):
    """Does a rule of @rules allow test @nodeid to skip for @reason?"""
    return any((fnmatch.fnmatchcase(nodeid, pat) or fnmatch.fnmatchcase(os.path.basename(nodeid), pat))
               and rx.search(reason) for pat, rx in rules)


class AllowedSkips:
    def __init__(self, rules):
        self.rules = rules
        self.unexpected = []

    def pytest_runtest_logreport(self, report):
        if report.skipped and not hasattr(report, "wasxfail"):
            reason = skip_reason(report)
            if not allowed(report.nodeid, reason, self.rules):
                self.unexpected.append((report.nodeid, reason))

    def pytest_terminal_summary(self, terminalreporter):
        if self.unexpected:
            terminalreporter.section("unexpected skips (not in tests/allowed-skips.txt)", red=True)
            for nodeid, reason in self.unexpected:
                terminalreporter.line(f"{nodeid}: {reason}")

    def pytest_sessionfinish(self, session, exitstatus):
        if self.unexpected and session.exitstatus == 0:
            session.exitstatus = 1


def pytest_configure(config):
    config.pluginmanager.register(AllowedSkips(load_rules()), "hwfs-allowed-skips")
