"""The one thing pyproject.toml cannot say: which folder holds which part of the `zmqflow` package.

The repository keeps one folder per layer at its top (common/, models/, inputs/, services/, jobs/,
cli/, bench/, loadtest/, data/); installed, each is a subpackage of the one import name `zmqflow`,
and zmqflow/ holds only the package's root (version, `python -m zmqflow`).
"""

from setuptools import find_packages, setup

FOLDERS = ("common", "models", "inputs", "adapters", "services", "jobs", "cli", "bench", "loadtest", "data")

packages, package_dir = ["zmqflow"], {"zmqflow": "zmqflow"}
for folder in FOLDERS:
    package_dir[f"zmqflow.{folder}"] = folder
    packages += [f"zmqflow.{folder}"] + [f"zmqflow.{folder}.{sub}" for sub in find_packages(folder)]

setup(packages=packages, package_dir=package_dir)
