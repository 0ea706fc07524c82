"""The spread tools: many tiny runs over seeds and numerics (``nemo-mmpo cpu spread``) and
their curves. The top room of :mod:`nemo_mmpo.cpu`."""
