"""Stand-in of neuronx_distributed_inference.models.config (NeuronConfig, config.py:84)."""

from nxdi_standin import NeuronConfig

__all__ = ["NeuronConfig"]
