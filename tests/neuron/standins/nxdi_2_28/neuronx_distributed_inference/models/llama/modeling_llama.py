"""Stand-in of neuronx_distributed_inference.models.llama.modeling_llama (:312 LlamaInferenceConfig, :1438
NeuronLlamaForCausalLM)."""

from nxdi_standin import LlamaInferenceConfig, NeuronLlamaForCausalLM

__all__ = ["LlamaInferenceConfig", "NeuronLlamaForCausalLM"]
