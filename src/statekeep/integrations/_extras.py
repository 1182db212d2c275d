"""The error a missing framework raises: it names the extra that installs it."""

from __future__ import annotations

from statekeep import errors


def missing(extra: str, feature: str, exc: ImportError) -> errors.StatekeepError:
    """A statekeep error saying which extra to install, for an ``ImportError`` of the framework."""
    module = exc.name or str(exc)
    cls = getattr(errors, "MissingExtraError", None)
    if cls is not None:
        error: errors.StatekeepError = cls(extra, feature, module)
        return error
    return errors.MissingDependencyError(f"statekeep[{extra}]", f"{feature} (module {module!r})")
