"""Top-p's threshold search pass: the mass above each of a row's thresholds (api.mass_above)."""

from pallas_kernels.nucleus_mass.api import mass_above

__all__ = ["mass_above"]
