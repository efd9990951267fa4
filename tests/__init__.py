"""The test suite: one directory per package of manager/ (tests/overlays/ for manager/overlays/, ...),
tests of the top-level modules here, whole-package tests in tests/package/, shared fixtures in
conftest.py and shared helpers in tests/helpers/. A package, so that two directories may hold test
files of the same name and every module imports the helpers as `tests.helpers...`."""
