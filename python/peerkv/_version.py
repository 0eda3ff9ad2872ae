"""The peerkv version: the one place it is written.

Read by pyproject.toml (the wheel's metadata), by the Makefile (stamped into
libpeerkv.so as `-X main.version`, which peerkv_version() reports) and by
peerkv.__version__. Keep it a single plain assignment: the Makefile and
setuptools read it without importing the package.
"""

__version__ = "0.1.0"
