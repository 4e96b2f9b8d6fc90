"""The vLLM tests use the integration tests' fixtures and helpers
(tests/integration_fixtures.py)."""

from integration_fixtures import (_environment, _watchdog, mount, mount_factory,  # noqa: F401
                                  pytest_configure)
