"""Stand-in for the modules of NxD Inference (SDK 2.28) that runtime/engines/neuron/spmd.py imports: each
re-exports tests/neuron/nxdi_standin.py (the torch reference model sharded as NxD shards). NOT NxD Inference."""
