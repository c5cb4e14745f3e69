"""The `neuron` engine: vLLM + NxD Inference on Trainium, one image per unit size.

`plan` computes each rank's exact environment, command and NxD Inference config (pure Python,
tested here) after contract/layout.py's check; `worker` is the follower loop that runs inside the
multi-node Neuron image only.
"""

from runtime.engines.neuron.launch import (
    NeuronOptions,
    NeuronUnitPlan,
    RankPlan,
    Recommendation,
    plan_member,
    plan_unit,
    recommend,
)

__all__ = [
    "NeuronOptions",
    "NeuronUnitPlan",
    "RankPlan",
    "Recommendation",
    "plan_member",
    "plan_unit",
    "recommend",
]
