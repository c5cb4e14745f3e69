"""The `neuron` engine: vLLM + NxD Inference on trn1, wired for multi-node units.

`plan` computes each rank's exact environment, command and NxD Inference config (pure Python,
tested here); `worker` is the follower loop that runs inside the Neuron container only.
"""

from runtime.engines.neuron.launch import (
    NeuronOptions,
    NeuronPlanError,
    NeuronUnitPlan,
    RankPlan,
    plan_member,
    plan_unit,
)
from runtime.engines.neuron.model import ModelConfigError, ModelShape, load_model_shape

__all__ = [
    "ModelConfigError",
    "ModelShape",
    "NeuronOptions",
    "NeuronPlanError",
    "NeuronUnitPlan",
    "RankPlan",
    "load_model_shape",
    "plan_member",
    "plan_unit",
]
