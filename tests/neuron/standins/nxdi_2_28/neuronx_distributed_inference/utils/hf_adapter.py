"""Stand-in of neuronx_distributed_inference.utils.hf_adapter (load_pretrained_config, :36)."""

from nxdi_standin import load_pretrained_config

__all__ = ["load_pretrained_config"]
