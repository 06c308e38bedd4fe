"""environment.yml and pyproject.toml list the same packages at the same versions."""
import os
import tomllib

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pins(reqs):
    return {r.split("==")[0].strip().lower(): r.split("==")[1].strip() for r in reqs if "==" in r}


def test_environment_yml_matches_pyproject():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    reqs = list(project["dependencies"])
    extras = dict(project["optional-dependencies"])
    deepspeed = extras.pop("deepspeed")  # installed after torch without build isolation
    for extra in extras.values():
        reqs += extra
    with open(os.path.join(ROOT, "environment.yml")) as f:
        text = f.read()
    env = yaml.safe_load(text)
    for pin in deepspeed:  # a comment says how, since conda's pip step cannot order installs
        assert f"pip install --no-build-isolation {pin}" in text
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    assert all("==" in r for r in reqs), "pin every package exactly (a loose torch pin pulls CUDA)"
    assert _pins(pip) == _pins(reqs)
    assert "-e ." in pip


def test_installed_versions_are_the_pinned_ones():
    from importlib.metadata import version

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    for name, want in _pins(deps).items():
        assert version(name).split("+")[0] == want, name
