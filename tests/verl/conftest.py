"""The verl tests use the integration tests' fixtures and helpers
(tests/integration/conftest.py), loaded under another module name so that
both directories can be collected in one run."""

import importlib.util
import sys
from pathlib import Path

_path = Path(__file__).resolve().parents[1] / "integration" / "conftest.py"
_spec = importlib.util.spec_from_file_location("hwfs_integration_conftest", _path)
_mod = importlib.util.module_from_spec(_spec)
sys.modules["hwfs_integration_conftest"] = _mod
_spec.loader.exec_module(_mod)

# fixtures and hooks: pytest finds them in this module's namespace
pytest_configure = _mod.pytest_configure
_environment = _mod._environment
_watchdog = _mod._watchdog
mount_factory = _mod.mount_factory
mount = _mod.mount
