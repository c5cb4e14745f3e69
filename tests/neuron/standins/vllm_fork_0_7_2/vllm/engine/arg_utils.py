"""Stand-in of the fork's AsyncEngineArgs (vllm/engine/arg_utils.py): the flags the multi-node example
passes and a few neighbours, with the fork's names and types. There is no --additional-config in the
fork, so argparse rejects it ("unrecognized arguments", exit 2)."""

import argparse
import json
from dataclasses import dataclass, field, fields

DEVICE_OPTIONS = ["auto", "cuda", "neuron", "cpu", "openvino", "tpu", "xpu", "hpu"]  # arg_utils.py:688-692


@dataclass
class EngineArgs:
    model: str = "facebook/opt-125m"
    served_model_name: object = None
    tokenizer: object = None
    dtype: str = "auto"
    seed: int = 0
    max_model_len: object = None
    block_size: object = None
    tensor_parallel_size: int = 1
    max_num_seqs: object = None
    device: str = "auto"
    override_neuron_config: dict = field(default_factory=dict)
    disable_log_requests: bool = False

    @staticmethod
    def add_cli_args(parser):
        parser.add_argument("--model", type=str, default=EngineArgs.model)
        parser.add_argument("--served-model-name", nargs="+", type=str, default=None)
        parser.add_argument("--tokenizer", type=str, default=None)
        parser.add_argument(
            "--dtype", type=str, default="auto", choices=["auto", "half", "float16", "bfloat16", "float", "float32"]
        )
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--max-model-len", type=int, default=None)
        parser.add_argument("--block-size", type=int, default=None, choices=[8, 16, 32, 64, 128])
        parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
        parser.add_argument("--max-num-seqs", type=int, default=None)
        parser.add_argument("--device", type=str, default="auto", choices=DEVICE_OPTIONS)
        parser.add_argument("--override-neuron-config", type=json.loads, default={})  # arg_utils.py:916-921
        parser.add_argument("--disable-log-requests", action="store_true")
        return parser

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace):
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})


@dataclass
class AsyncEngineArgs(EngineArgs):
    pass
