"""The capacity planner's lookup into the Trainium table (contract/trainium.py).

It refuses instance types a multi-node unit cannot use, naming the ones it can.
"""

from __future__ import annotations

from contract.trainium import INSTANCES, TrainiumInstance


def instance_spec(instance_type: str) -> TrainiumInstance:
    try:
        return INSTANCES[instance_type]
    except KeyError:
        raise ValueError(
            f"instance type {instance_type!r} is not supported: use one of {', '.join(sorted(INSTANCES))} "
            "(multi-node units need EFA, which trn1.2xlarge lacks)"
        ) from None
