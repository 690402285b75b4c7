"""Name -> object registries, so a YAML string picks a loss, estimator, reward or backend."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Callable


class Registry:
    """A named table of plug-ins. Names that contain ':' are imported as `module:attr` paths.

    `plugins`: the modules that register the built-ins, imported on the first lookup. The registry
    lives where its plug-ins import it from, and that module never imports them back (no package
    `__init__` in a circle with its plug-ins: tests/test_imports.py)."""

    def __init__(self, kind: str, plugins: tuple[str, ...] = ()):
        self.kind = kind
        self._items: dict[str, Any] = {}
        self._plugins, self._loaded = tuple(plugins), not plugins

    def _load(self) -> None:
        if not self._loaded:
            self._loaded = True  # first: a plug-in that looks something up while it registers
            for module in self._plugins:
                importlib.import_module(module)

    def register(self, name: str) -> Callable[[Any], Any]:
        def deco(obj: Any) -> Any:
            if name in self._items and self._items[name] is not obj:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
            return obj

        return deco

    def register_paths(self, paths: dict[str, str]) -> None:
        """Register built-ins by `module:attr` path (a LazyRegistry imports each on first use)."""
        for name, path in paths.items():
            self.register(name)(path)

    def snapshot(self) -> dict[str, Any]:
        """A copy of the table, built-ins loaded (a test that registers restores it afterwards)."""
        self._load()
        return dict(self._items)

    def names(self) -> list[str]:
        self._load()
        return sorted(self._items)

    def __contains__(self, name: str) -> bool:
        self._load()
        return name in self._items or ":" in name

    def get(self, name: str) -> Any:
        self._load()
        if name in self._items:
            return self._items[name]
        if ":" in name:
            return import_path(name, what=self.kind)
        raise KeyError(f"unknown {self.kind} {name!r}; registered: {', '.join(self.names())} "
                       f"(or give a 'module:function' import path)")


def import_path(path: str, what: str = "object") -> Any:
    """Import `package.module:attr`; errors name the path and what went wrong."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ValueError(f"{what} path {path!r} must look like 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is None or not _names_the_module(e.name, module_name):
            raise PluginImportError(_failed_import(module_name, what, path, e)) from None
        raise ImportError(f"cannot import module {module_name!r} for {what} {path!r}: {e}") from e
    except ImportError as e:
        raise PluginImportError(_failed_import(module_name, what, path, e)) from None
    except Exception as e:  # noqa: BLE001  (a SyntaxError, or any exception the module raised at import)
        raise PluginImportError(_failed_import(module_name, what, path, e)) from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ImportError(f"module {module_name!r} has no attribute {attr!r} (from {what} {path!r})") from None


class PluginImportError(ImportError):
    """A plug-in module that exists but fails while it is imported (a SyntaxError, an exception its
    top level raised, a module it imports that is missing): the message names the file and line."""


def _names_the_module(missing: str, module_name: str) -> bool:
    """A ModuleNotFoundError about `module_name` itself or a package above it (not one it imports)."""
    return module_name == missing or module_name.startswith(missing + ".")


def _failed_import(module_name: str, what: str, path: str, error: BaseException) -> str:
    """One line: which module failed, where (file and line), and what it raised."""
    import traceback

    if isinstance(error, SyntaxError) and error.filename:
        where = f"{error.filename}, line {error.lineno}"
        code = f": {error.text.strip()}" if error.text and error.text.strip() else ""
        return (f"module {module_name!r} for {what} {path!r} does not compile: {where}: "
                f"{type(error).__name__}: {error.msg}{code}")
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if not f.filename.startswith("<frozen ") and "importlib" not in Path(f.filename).parts[-2:-1]
              and f.filename != __file__]
    where = ""
    if frames:
        top, deepest = frames[0], frames[-1]  # the module's own line, and where the error was raised
        where = f" at {top.filename}, line {top.lineno}"
        if (deepest.filename, deepest.lineno) != (top.filename, top.lineno):
            where += f" (raised in {deepest.filename}, line {deepest.lineno})"
    return (f"module {module_name!r} for {what} {path!r} failed while being imported{where}: "
            f"{type(error).__name__}: {error}")


class LazyRegistry(Registry):
    """Registry whose built-in entries may be `module:attr` strings, imported on first use (so the
    registry's module need not import the packages that hold them)."""

    def get(self, name: str) -> Any:
        item = super().get(name)
        if isinstance(item, str):
            item = import_path(item, what=f"{self.kind} {name!r}")
            self._items[name] = item
        return item
