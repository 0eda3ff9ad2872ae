"""The wheel tests run against an installed wheel, never the source tree:
nothing here puts python/ on sys.path (unlike tests/python/conftest.py)."""
