"""Memory of a run on its devices: planned before loading anything, and measured.

- :mod:`~cmbench.backbones.memory.weights`: model bytes from meta-device models;
- :mod:`~cmbench.backbones.memory.kv`: the KV cache replayed with the cache's own allocation rules;
- :mod:`~cmbench.backbones.memory.workspace`: activation estimates of the model calls;
- :mod:`~cmbench.backbones.memory.plan`: phases, offloads, the fit and the refusal message;
- :mod:`~cmbench.backbones.memory.run_plan`: a run config -> its plan (``python -m cmbench plan``, ``run``);
- :mod:`~cmbench.backbones.memory.measure`: peak allocated bytes, to check a plan against.
"""
