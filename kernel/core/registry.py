"""Which models exist, which versions are loaded, and in what state."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from kernel.core.errors import ErrorCode, KernelError
from kernel.core.model import Model, ModelState


# The reason the repository index gives for a version that was unloaded on request.
UNLOADED = "unloaded"


@dataclass
class ModelEntry:
    name: str
    versions: dict[int, Model] = field(default_factory=dict)
    state: ModelState = ModelState.LOADING
    reason: str = ""
    # Versions that are not served, with why (failed to load, or UNLOADED):
    # the repository index reports them as UNAVAILABLE.
    unavailable: dict[int, str] = field(default_factory=dict)

    @property
    def unloaded(self) -> bool:
        """Unloaded on request: not served, and (as in Triton) no reason for the server to be unready."""
        return not self.versions and self.state is ModelState.UNAVAILABLE and self.reason == UNLOADED

    def latest_ready(self) -> Optional[Model]:
        best = None
        for v, m in self.versions.items():
            if m.state is ModelState.READY and (best is None or v > best.version):
                best = m
        return best


class ModelRegistry:
    def __init__(self) -> None:
        self.entries: dict[str, ModelEntry] = {}

    def entry(self, name: str) -> ModelEntry:
        e = self.entries.get(name)
        if e is None:
            e = self.entries[name] = ModelEntry(name)
        return e

    def get(self, name: str, version: str = "") -> Model:
        """The model version a request names ('' = latest ready). Raises with Triton's messages."""
        e = self.entries.get(name)
        if e is None:
            raise KernelError(ErrorCode.NOT_FOUND, f"Request for unknown model: '{name}' is not found")
        if not version:
            m = e.latest_ready()
            if m is None:
                raise KernelError(
                    ErrorCode.NOT_FOUND, f"Request for unknown model: '{name}' has no available versions"
                )
            return m
        try:
            v = int(version)
        except ValueError:
            raise KernelError(
                ErrorCode.INVALID_ARG, f"failed to parse model version '{version}': not a number"
            ) from None
        m = e.versions.get(v)
        if m is None:
            raise KernelError(ErrorCode.NOT_FOUND, f"Request for unknown model: '{name}' version {v} is not found")
        if m.state is not ModelState.READY:
            raise KernelError(
                ErrorCode.UNAVAILABLE, f"Request for unknown model: '{name}' version {v} is not at ready state"
            )
        return m

    def all_models(self) -> list[Model]:
        return [m for e in self.entries.values() for m in e.versions.values()]
