"""The `neuron` engine: vLLM + NxD Inference on Trainium, one image per unit size.

`plan` computes each rank's exact environment, command and NxD Inference config (pure Python,
tested here); `worker` is the follower loop that runs inside the multi-node Neuron image only.
"""

from runtime.engines.neuron.launch import (
    NeuronOptions,
    NeuronPlanError,
    NeuronUnitPlan,
    RankPlan,
    Recommendation,
    plan_member,
    plan_unit,
    recommend,
)
from runtime.engines.neuron.model import ModelConfigError, ModelShape, load_model_shape

__all__ = [
    "ModelConfigError",
    "ModelShape",
    "NeuronOptions",
    "NeuronPlanError",
    "NeuronUnitPlan",
    "RankPlan",
    "Recommendation",
    "load_model_shape",
    "plan_member",
    "plan_unit",
    "recommend",
]
