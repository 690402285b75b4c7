"""Example recipes that live outside the package: each is one file plus its YAML (docs/extending.md)."""
