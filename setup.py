"""Ship the catalog (overlays/, profiles/, compose/: top-level in the repository) inside the package.

The wheel gets them as `manager/_catalog/{overlays,profiles,compose}` and `manager.catalog`
finds them there through importlib.resources; the sdist carries them top-level (MANIFEST.in),
exactly as in the repository. Everything else is declared in pyproject.toml.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

CATALOG_PARTS = ("overlays", "profiles", "compose")
HERE = Path(__file__).resolve().parent


class build_py_with_catalog(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads the catalog from the checkout itself
        dest = Path(self.build_lib) / "manager" / "_catalog"
        shutil.rmtree(dest, ignore_errors=True)
        for part in CATALOG_PARTS:
            src = HERE / part
            if src.is_dir():
                shutil.copytree(src, dest / part, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".*"))


setup(cmdclass={"build_py": build_py_with_catalog})
