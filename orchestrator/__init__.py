"""coevo control plane: config, the Arrow batch contract, the async loop, metrics, checkpoints, CLI."""

from pathlib import Path


def _version() -> str:
    """The source tree's version where this package sits beside its pyproject.toml (a checkout,
    pip-installed in editable mode or not at all: `python -m orchestrator.cli` on a machine with no
    registry), else the installed distribution's."""
    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    if pyproject.is_file():
        import tomllib

        try:
            project = tomllib.loads(pyproject.read_text()).get("project", {})
        except (OSError, tomllib.TOMLDecodeError):
            project = {}
        if project.get("name") == "coevo" and project.get("version"):
            return project["version"]
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("coevo")
    except PackageNotFoundError:
        return "unknown (neither a source tree nor installed)"


__version__ = _version()
