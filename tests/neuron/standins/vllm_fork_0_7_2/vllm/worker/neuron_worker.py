"""Stand-in of the fork's NeuronWorker (vllm/worker/neuron_worker.py) with the V0 step protocol of
vllm/worker/worker_base.py:307-391, over a real torch gloo group (loopback in the tests)."""

import json
import os
import time
from datetime import timedelta

DEFAULT_WORLD_SIZE = "1"  # neuron_worker.py:26-28
DEFAULT_NEURON_RANK_ID = "0"
DEFAULT_ENABLE_NEURON_MULTI_NODE = "False"


def standin_log(entry):
    path = os.environ.get("STANDIN_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(entry) + "\n")


class NeuronWorker:
    def __init__(self, engine_args, rank=0, distributed_init_method="tcp://127.0.0.1:0", is_driver_worker=True):
        self.engine_args = engine_args
        self.rank = rank
        self.distributed_init_method = distributed_init_method
        self.is_driver_worker = is_driver_worker
        # neuron_worker.py:50-60
        self.enable_neuron_multi_node = (
            os.getenv("ENABLE_NEURON_MULTI_NODE", DEFAULT_ENABLE_NEURON_MULTI_NODE).lower() == "true"
        )
        self.world_size = int(os.getenv("WORLD_SIZE", DEFAULT_WORLD_SIZE))
        if self.enable_neuron_multi_node:
            self.rank = int(os.getenv("NEURON_RANK_ID", DEFAULT_NEURON_RANK_ID))
            self.distributed_init_method = "env://"
            self.is_driver_worker = self.rank == 0
        self.steps = 0
        self._dist = None
        self.init_distributed_environment()

    @property
    def do_metadata_broadcast(self):
        return self.enable_neuron_multi_node and self.world_size > 1  # neuron_worker.py:161-163

    def init_distributed_environment(self):
        if self.world_size == 1:
            return  # one process: nothing to join (a stand-in shortcut; vLLM makes a group of one)
        import torch.distributed as dist

        kwargs = {}
        if os.environ.get("STANDIN_GLOO_TIMEOUT_S"):
            kwargs["timeout"] = timedelta(seconds=float(os.environ["STANDIN_GLOO_TIMEOUT_S"]))
        # parallel_state.py:974-978: no timeout passed, so torch's default applies.
        dist.init_process_group(
            "gloo",
            init_method=self.distributed_init_method,
            world_size=self.world_size,
            rank=self.rank,
            **kwargs,
        )
        self._dist = dist

    def _broadcast(self, obj):
        box = [obj]
        self._dist.broadcast_object_list(box, src=0)
        return box[0]

    def execute_model(self, execute_model_req=None):
        """worker_base.py:356-391: the driver broadcasts the step's inputs (or {} for "no more");
        a follower blocks until they arrive and returns None on {}."""
        if self.is_driver_worker:
            if execute_model_req is None:
                if self.do_metadata_broadcast:
                    self._broadcast({})
                return None
            if self.do_metadata_broadcast:
                self._broadcast(execute_model_req)
            data = execute_model_req
        else:
            data = self._broadcast(None)
            if not data:
                return None
            standin_log({"follower_step": data["step"], "rank": self.rank, "seqs": data["seqs"], "t": time.time()})
        self.steps += 1
        return data
