"""The integration tests' fixtures and hooks for the other test directories
(tests/vllm, tests/verl): tests/integration/conftest.py loaded once under the
module name hwfs_integration_conftest, so that several directories can be
collected in one run.  A directory's conftest.py imports the names below
into its own namespace, where pytest finds them."""

import importlib.util
import sys
from pathlib import Path

_NAME = "hwfs_integration_conftest"
_mod = sys.modules.get(_NAME)
if _mod is None:
    _path = Path(__file__).resolve().parent / "integration" / "conftest.py"
    _spec = importlib.util.spec_from_file_location(_NAME, _path)
    _mod = importlib.util.module_from_spec(_spec)
    sys.modules[_NAME] = _mod
    _spec.loader.exec_module(_mod)

pytest_configure = _mod.pytest_configure
_environment = _mod._environment
_watchdog = _mod._watchdog
mount_factory = _mod.mount_factory
mount = _mod.mount
